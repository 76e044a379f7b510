package cdi

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpuaas/gpu-dra-driver/pkg/cdi/cditest"
)

// memoryLimitDriverVersion is a driver that enforces per-container memory
// limits (r615 and later).
const memoryLimitDriverVersion = "615.20.03"

// memoryLimitHandler is a handler over a fake install of driver version
// with NVIDIA's hooks on, on a host whose cgroups are v2 or not.
func memoryLimitHandler(t *testing.T, version string, cgroupV2 bool) (*Handler, string, *cditest.DriverRoot) {
	t.Helper()
	return memoryLimitHandlerWith(t, version, cgroupV2, cditest.DynamicHook(t))
}

// memoryLimitHandlerWith is memoryLimitHandler with the hook binary hook.
func memoryLimitHandlerWith(t *testing.T, version string, cgroupV2 bool, hook string) (*Handler, string, *cditest.DriverRoot) {
	t.Helper()
	root := cditest.NewDriverRoot(t, version)
	lib := dgxh100.New()
	lib.DriverVersion = version
	h, cdiRoot := newHandler(t, root.Root, func(o *Options) {
		o.NVML = lib
		o.CDIHookPath = hook
		o.CgroupV2 = func() (bool, string) {
			if cgroupV2 {
				return true, ""
			}
			return false, "cgroup v1 in this test"
		}
	})
	return h, cdiRoot, root
}

// memoryShare is a 10 GiB share of GPU 0 plus half a MiB: the limit is
// whole MiB, rounded down.
func memoryShare() Device {
	return Device{Name: "gpu-0-shared", UUID: "GPU-aaaa", Minor: 0, MemoryLimitBytes: 10<<30 + 512<<10}
}

func memoryLimitHooks(hooks []*specs.Hook) []*specs.Hook {
	return slices.DeleteFunc(slices.Clone(hooks), func(h *specs.Hook) bool { return !slices.Contains(h.Args, memoryLimitHookName) })
}

// On a driver that enforces per-container memory limits, a memory share's
// device carries NVIDIA's hook for its GPU and the share's size in MiB:
// before, the spec carried no limit and the share's container could fill
// the whole GPU.
func TestMemoryShareCarriesTheDriversMemoryLimit(t *testing.T) {
	hook := cditest.DynamicHook(t)
	h, cdiRoot, root := memoryLimitHandlerWith(t, memoryLimitDriverVersion, true, hook)
	if got := h.MemoryLimits(); !got.Enforced {
		t.Fatalf("MemoryLimits on driver %s, cgroup v2, hooks on = %+v, want enforced", memoryLimitDriverVersion, got)
	}
	write(t, h, claimUID, []Device{memoryShare()})
	spec := readBack(t, cdiRoot, claimUID)
	dev := spec.Devices[0].ContainerEdits

	hooks := memoryLimitHooks(dev.Hooks)
	want := []string{"nvidia-cdi-hook", "apply-cuda-memory-limits", "--driver-root", root.Root, "--gpu-id", "GPU-aaaa"}
	if len(hooks) != 1 || hooks[0].HookName != "createRuntime" || hooks[0].Path != hook || !slices.Equal(hooks[0].Args, want) {
		t.Fatalf("the share's memory-limit hooks = %+v, want one createRuntime hook %s %v", hooks, hook, want)
	}
	for _, k := range []string{memoryLimitEnv, memoryRequestEnv} {
		if v := envValues(dev.Env, k); !slices.Equal(v, []string{"10240"}) {
			t.Errorf("%s = %v, want [10240] (10 GiB and half a MiB, rounded down)", k, v)
		}
	}
	if n := len(memoryLimitHooks(spec.ContainerEdits.Hooks)); n != 0 {
		t.Errorf("%d memory-limit hooks at spec level: a container given another device of the claim would get them", n)
	}
}

// Where the driver cannot enforce the limit, the spec names neither the
// hook nor its environment, and the handler says why: on a cgroup v1 host
// the hook fails the container's creation, before r615 the driver refuses
// the call, and with hooks disabled there is no hook to run.
func TestNoMemoryLimitWhereTheDriverCannotEnforceIt(t *testing.T) {
	for _, tc := range []struct {
		name, version string
		cgroupV2      bool
		hooksOff      bool
		staticHook    bool
		reason        string
	}{
		{name: "statically linked hook", version: memoryLimitDriverVersion, cgroupV2: true, staticHook: true, reason: "statically linked"},
		{name: "driver before r615", version: "580.95.05", cgroupV2: true, reason: "r615"},
		{name: "cgroup v1", version: memoryLimitDriverVersion, reason: "cgroup v1 in this test"},
		{name: "hooks disabled", version: memoryLimitDriverVersion, cgroupV2: true, hooksOff: true, reason: HooksDisabled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hook := cditest.DynamicHook(t)
			if tc.staticHook {
				hook = staticExecutable(t)
			}
			h, cdiRoot, root := memoryLimitHandlerWith(t, tc.version, tc.cgroupV2, hook)
			if tc.hooksOff {
				lib := dgxh100.New()
				lib.DriverVersion = tc.version
				h, cdiRoot = newHandler(t, root.Root, func(o *Options) { o.NVML = lib; o.CgroupV2 = func() (bool, string) { return true, "" } })
			}
			if got := h.MemoryLimits(); got.Enforced || !strings.Contains(got.Reason, tc.reason) {
				t.Fatalf("MemoryLimits = %+v, want not enforced, the reason naming %q", got, tc.reason)
			}
			write(t, h, claimUID, []Device{memoryShare()})
			dev := readBack(t, cdiRoot, claimUID).Devices[0].ContainerEdits
			if hooks := memoryLimitHooks(dev.Hooks); len(hooks) != 0 {
				t.Errorf("memory-limit hooks %+v where the driver cannot enforce them", hooks)
			}
			if v := envValues(dev.Env, memoryLimitEnv); len(v) != 0 {
				t.Errorf("%s = %v where no hook reads it", memoryLimitEnv, v)
			}
		})
	}
}

// The hook gets the driver root as the host sees it: it runs on the host.
func TestMemoryLimitHookNamesTheHostsDriverRoot(t *testing.T) {
	root := cditest.NewDriverRoot(t, memoryLimitDriverVersion)
	lib := dgxh100.New()
	lib.DriverVersion = memoryLimitDriverVersion
	h, cdiRoot := newHandler(t, root.Root, func(o *Options) {
		o.NVML, o.CDIHookPath, o.HostDriverRoot = lib, cditest.DynamicHook(t), "/"
		o.CgroupV2 = func() (bool, string) { return true, "" }
	})
	write(t, h, claimUID, []Device{memoryShare()})
	hooks := memoryLimitHooks(readBack(t, cdiRoot, claimUID).Devices[0].ContainerEdits.Hooks)
	if len(hooks) != 1 || !slices.Equal(hooks[0].Args[2:4], []string{"--driver-root", "/"}) {
		t.Fatalf("memory-limit hooks = %+v, want --driver-root /", hooks)
	}
}

// A claim whose limited devices differ in size is refused: one container
// holds one NVIDIA_GPU_MEMORY_LIMIT (the runtime keeps the last value of a
// name), which the hooks of both GPUs would apply. Devices of one size,
// and unlimited ones beside them, are fine.
func TestLimitedDevicesOfDifferentSizesAreRefused(t *testing.T) {
	h, _, _ := memoryLimitHandler(t, memoryLimitDriverVersion, true)
	small, large := memoryShare(), Device{Name: "gpu-1-shared", UUID: "GPU-bbbb", Minor: 1, MemoryLimitBytes: 20 << 30}
	_, err := h.WriteClaimSpec(claimUID, []Device{small, large})
	if err == nil || !strings.Contains(err.Error(), "different memory limits") || !strings.Contains(err.Error(), "gpu-1-shared") {
		t.Fatalf("WriteClaimSpec of a 10 GiB and a 20 GiB share = %v, want a refusal naming both", err)
	}
	// Where the driver enforces no limit, none is written, and sizes
	// may differ.
	v1, _, _ := memoryLimitHandler(t, memoryLimitDriverVersion, false)
	write(t, v1, claimUID, []Device{small, large})
	large.MemoryLimitBytes = small.MemoryLimitBytes
	whole := Device{Name: "gpu-2", UUID: "GPU-cccc", Minor: 2}
	write(t, h, claimUID, []Device{small, large, whole})
}

// A MIG device never gets a limit: the driver refuses one on a MIG handle.
func TestMemoryLimitOnMIGDeviceIsRefused(t *testing.T) {
	h, _, _ := memoryLimitHandler(t, memoryLimitDriverVersion, true)
	d := migDevice()
	d.MemoryLimitBytes = 10 << 30
	if _, err := h.WriteClaimSpec(claimUID, []Device{d}); err == nil || !strings.Contains(err.Error(), "MIG") {
		t.Fatalf("WriteClaimSpec of a MIG device with a memory limit = %v, want a refusal", err)
	}
}

// staticExecutable is a statically linked ELF executable named
// nvidia-cdi-hook: the ELF header of a dynamic one with its program
// headers rewritten so that none is the interpreter's.
func staticExecutable(t *testing.T) string {
	t.Helper()
	dynamic, err := filepath.EvalSymlinks(cditest.DynamicHook(t))
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(dynamic)
	if err != nil {
		t.Fatal(err)
	}
	f, err := elf.NewFile(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	if f.Class != elf.ELFCLASS64 || f.Data != elf.ELFDATA2LSB {
		t.Fatalf("%s is not a little-endian 64-bit ELF file", dynamic)
	}
	// PT_INTERP becomes PT_NULL in the program header table (ELF64 little
	// endian: phoff at 32, phentsize at 54, phnum at 56, p_type first).
	phoff := binary.LittleEndian.Uint64(data[32:])
	size, n := binary.LittleEndian.Uint16(data[54:]), binary.LittleEndian.Uint16(data[56:])
	for i := range uint64(n) {
		at := phoff + i*uint64(size)
		if elf.ProgType(binary.LittleEndian.Uint32(data[at:])) == elf.PT_INTERP {
			binary.LittleEndian.PutUint32(data[at:], uint32(elf.PT_NULL))
		}
	}
	path := filepath.Join(t.TempDir(), HookBinary)
	if err := os.WriteFile(path, data, 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

// With the host's root mounted in the plugin (HostDriverRoot "/", the
// driver root its mount), a hook path on the host is checked where the
// plugin sees the host's file: the plugin's own /usr/bin/nvidia-cdi-hook is
// the image's (static), not the host's.
func TestHostsHookIsCheckedUnderTheDriverRoot(t *testing.T) {
	root := cditest.NewDriverRoot(t, memoryLimitDriverVersion)
	const hostHook = "/usr/local/nvidia/toolkit/nvidia-cdi-hook"
	if fileExists(hostHook) {
		t.Skipf("%s exists in the test's own root", hostHook)
	}
	if err := os.MkdirAll(filepath.Join(root.Root, filepath.Dir(hostHook)), 0o755); err != nil {
		t.Fatal(err)
	}
	dynamic, err := filepath.EvalSymlinks(cditest.DynamicHook(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(dynamic, filepath.Join(root.Root, hostHook)); err != nil {
		t.Fatal(err)
	}
	lib := dgxh100.New()
	lib.DriverVersion = memoryLimitDriverVersion
	h, _ := newHandler(t, root.Root, func(o *Options) {
		o.NVML, o.CDIHookPath, o.HostDriverRoot = lib, hostHook, "/"
		o.CgroupV2 = func() (bool, string) { return true, "" }
	})
	if got := h.MemoryLimits(); !got.Enforced {
		t.Fatalf("MemoryLimits with the host's dynamic hook at %s under the driver root: %+v, want enforced", hostHook, got)
	}
}
