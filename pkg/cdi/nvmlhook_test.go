package cdi

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"

	"github.com/gpuaas/gpu-dra-driver/pkg/cdi/cditest"
)

// installedNVMLHook installs a dynamic executable of this host (standing
// for the image's dynamic hook) as the NVML hook under a new directory.
func installedNVMLHook(t *testing.T) NVMLHook {
	t.Helper()
	h, err := InstallNVMLHook(cditest.DynamicHook(t), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// The release image's nvidia-cdi-hook is static, so it cannot load NVML:
// with it alone no node enforced a memory limit (HookCannotLoadNVML on
// every node running our image). With the image's NVML hook installed, a
// share's spec runs NVIDIA's hook through the installed loader and glibc.
func TestAStaticHookWithTheNVMLHookWritesMemoryLimits(t *testing.T) {
	nvmlHook := installedNVMLHook(t)
	root := cditest.NewDriverRoot(t, memoryLimitDriverVersion)
	lib := dgxh100.New()
	lib.DriverVersion = memoryLimitDriverVersion
	static := staticExecutable(t)
	h, cdiRoot := newHandler(t, root.Root, func(o *Options) {
		o.NVML, o.CDIHookPath, o.NVMLHook = lib, static, nvmlHook
		o.CgroupV2 = func() (bool, string) { return true, "" }
	})
	if got := h.MemoryLimits(); !got.Enforced {
		t.Fatalf("MemoryLimits with a static hook and the NVML hook = %+v, want enforced", got)
	}
	write(t, h, claimUID, []Device{memoryShare()})
	spec := readBack(t, cdiRoot, claimUID)
	hooks := memoryLimitHooks(spec.Devices[0].ContainerEdits.Hooks)
	want := []string{filepath.Base(nvmlHook.Loader), "--library-path", nvmlHook.LibDir, nvmlHook.Binary,
		"apply-cuda-memory-limits", "--driver-root", root.Root, "--gpu-id", "GPU-aaaa"}
	if len(hooks) != 1 || hooks[0].Path != nvmlHook.Loader || !slices.Equal(hooks[0].Args, want) {
		t.Fatalf("memory-limit hooks = %+v, want one running %s %v", hooks, nvmlHook.Loader, want)
	}
	// The other hooks (links, ldcache) stay the static one's.
	for _, hk := range spec.ContainerEdits.Hooks {
		if hk.Path != static {
			t.Errorf("spec-level hook %s %v, want every one run by %s", hk.Path, hk.Args, static)
		}
	}
}

// An NVML hook whose loader went missing (a host directory cleaned) is
// not named in a spec: the container would fail to start.
func TestAnNVMLHookWithoutItsLoaderIsNotUsed(t *testing.T) {
	nvmlHook := installedNVMLHook(t)
	if err := os.Remove(nvmlHook.Loader); err != nil {
		t.Fatal(err)
	}
	root := cditest.NewDriverRoot(t, memoryLimitDriverVersion)
	lib := dgxh100.New()
	lib.DriverVersion = memoryLimitDriverVersion
	h, _ := newHandler(t, root.Root, func(o *Options) {
		o.NVML, o.CDIHookPath, o.NVMLHook = lib, staticExecutable(t), nvmlHook
		o.CgroupV2 = func() (bool, string) { return true, "" }
	})
	if got := h.MemoryLimits(); got.Enforced || got.Cause != CauseStaticHook {
		t.Fatalf("MemoryLimits = %+v, want not enforced, cause %s", got, CauseStaticHook)
	}
}

// The installed hook runs with its own loader and the libraries installed
// beside it, not the host's: the loader's own trace shows libc loaded
// from the installed directory.
func TestTheNVMLHookRunsOnItsOwnGlibc(t *testing.T) {
	h := installedNVMLHook(t)
	for _, lib := range append([]string{filepath.Base(h.Loader)}, nvmlRuntimeLibraries...) {
		if _, err := os.Stat(filepath.Join(h.LibDir, lib)); err != nil {
			t.Errorf("installed libraries: %v", err)
		}
	}
	path, args := h.command("-c", "echo ran")
	cmd := exec.Command(path, args[1:]...)
	cmd.Env = []string{"LD_DEBUG=libs", "PATH=/usr/bin:/bin"}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("running the installed hook: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "ran") {
		t.Fatalf("the installed hook's output %q, want it to have run", out)
	}
	if libc := filepath.Join(h.LibDir, "libc.so.6"); !strings.Contains(string(out), "calling init: "+libc) {
		t.Errorf("libc was not loaded from %s:\n%s", libc, out)
	}
}

// A static binary given as the NVML hook is refused, naming why; an
// unchanged install is not rewritten (two plugin pods of a rolling update
// install it at once).
func TestInstallNVMLHook(t *testing.T) {
	if _, err := InstallNVMLHook(staticExecutable(t), t.TempDir()); err == nil || !strings.Contains(err.Error(), "statically linked") {
		t.Errorf("installing a static NVML hook: %v, want it refused as statically linked", err)
	}
	src, dir := cditest.DynamicHook(t), t.TempDir()
	h, err := InstallNVMLHook(src, dir)
	if err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-time.Hour)
	if err := os.Chtimes(h.Binary, old, old); err != nil {
		t.Fatal(err)
	}
	if _, err := InstallNVMLHook(src, dir); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(h.Binary); err != nil || !st.ModTime().Equal(old) {
		t.Errorf("the unchanged hook was rewritten (%v, %v)", st.ModTime(), err)
	}
}
