package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/gpuaas/gpu-dra-driver/pkg/cdi"
	"github.com/gpuaas/gpu-dra-driver/pkg/cdi/cditest"
	"github.com/gpuaas/gpu-dra-driver/pkg/mig"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev/nvmock"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	specs "tags.cncf.io/container-device-interface/specs-go"
)

// The memory-limit tests run NVIDIA's real hook (nvidia-cdi-hook
// apply-cuda-memory-limits, dynamically linked: it dlopens the driver's
// NVML) as the runtime runs a createRuntime hook: on the host, the OCI
// state of a container being created on its stdin, with the arguments and
// environment our CDI spec gives a share or a replica. The driver's NVML is
// this library over a simulated machine on driver r615, and the limit the
// hook sets is read back from the machine's state file. The hook refuses
// cgroup v1, so it runs in a mount namespace of its own where
// /sys/fs/cgroup is the host's cgroup2 hierarchy (on a hybrid host,
// /sys/fs/cgroup/unified), and the container is a child process in a
// cgroup of its own there.

const memoryLimitDriver = "615.20.03"

// unifiedCgroup is where this host's cgroup2 hierarchy is mounted.
func unifiedCgroup(t *testing.T) string {
	t.Helper()
	for _, dir := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified"} {
		if ok, _ := cdi.StatCgroupV2(dir); ok {
			return dir
		}
	}
	t.Fatal("no cgroup2 hierarchy under /sys/fs/cgroup: NVIDIA's hook cannot set a memory limit on this host")
	return ""
}

// memoryLimitHost checks what the test needs of the host, skipping where
// it cannot run at all.
func memoryLimitHost(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: a mount namespace, a cgroup, and the driver's limits are root's to set")
	}
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("needs unshare (util-linux) for the hook's mount namespace")
	}
}

// staticHook builds NVIDIA's hook at the pinned toolkit version as the
// release image ships it, statically linked (make cdi-hook's, cached).
func staticHook(t *testing.T) string {
	t.Helper()
	root := repoRoot(t)
	bin := filepath.Join(root, "_output", "bin")
	cmd := exec.Command(filepath.Join(root, "hack", "build-cdi-hook.sh"))
	cmd.Env = append(os.Environ(), "CDI_HOOK_LINK=static", "KUBE_BIN_DIR="+bin)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building the statically linked nvidia-cdi-hook: %v\n%s", err, out)
	}
	return filepath.Join(bin, cdi.HookBinary)
}

// dynamicHook builds NVIDIA's hook at the pinned toolkit version,
// dynamically linked (cached by hack/build-cdi-hook.sh's stamp).
func dynamicHook(t *testing.T) string {
	t.Helper()
	root := repoRoot(t)
	bin := filepath.Join(root, "_output", "hookdyn")
	cmd := exec.Command(filepath.Join(root, "hack", "build-cdi-hook.sh"))
	cmd.Env = append(os.Environ(), "CDI_HOOK_LINK=dynamic", "KUBE_BIN_DIR="+bin)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building the dynamically linked nvidia-cdi-hook: %v\n%s", err, out)
	}
	return filepath.Join(bin, cdi.HookBinary)
}

// container is a process in a cgroup of its own, standing for a
// container the runtime is creating.
type container struct {
	pid    int
	cgroup string // the hook's view: /sys/fs/cgroup/<name>
	bundle string
}

func newContainer(t *testing.T, unified string, env []string) *container {
	t.Helper()
	name := fmt.Sprintf("gpuaas-memlimit-%d-%d", os.Getpid(), time.Now().UnixNano())
	dir := filepath.Join(unified, name)
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatalf("creating the container's cgroup: %v", err)
	}
	sleep := exec.Command("sleep", "600")
	if err := sleep.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = sleep.Process.Kill()
		_ = sleep.Wait()
		_ = os.Remove(dir)
	})
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(sleep.Process.Pid)), 0o644); err != nil {
		t.Fatalf("moving the container's process into its cgroup: %v", err)
	}
	bundle := t.TempDir()
	config, err := json.Marshal(map[string]any{"ociVersion": "1.0.2", "process": map[string]any{"env": env, "cwd": "/", "args": []string{"sh"}},
		"root": map[string]any{"path": "rootfs"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), config, 0o644); err != nil {
		t.Fatal(err)
	}
	return &container{pid: sleep.Process.Pid, cgroup: filepath.Join("/sys/fs/cgroup", name), bundle: bundle}
}

// runHook runs hook as the runtime would for c, in a mount namespace
// whose /sys/fs/cgroup is the cgroup2 hierarchy, with NVML the simulated
// library of node n on driver r615 (driverRoot holds that driver's files).
func (n *node) runHook(t *testing.T, hook *specs.Hook, c *container, driverRoot string) (string, error) {
	t.Helper()
	state, err := json.Marshal(map[string]any{"ociVersion": "1.0.2", "id": "c1", "status": "creating", "pid": c.pid, "bundle": c.bundle})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	script := `mount --bind "$0" /sys/fs/cgroup && exec "$@"`
	cmd := exec.CommandContext(ctx, "unshare", append([]string{"-m", "sh", "-c", script, unifiedCgroup(t), hook.Path}, hook.Args[1:]...)...)
	cmd.Env = append(os.Environ(), hook.Env...)
	cmd.Env = append(cmd.Env, envStateDir+"="+n.state, envSeed+"="+testSeed, envMachine+"=dgxh100", envDriverRoot+"="+driverRoot)
	cmd.Stdin = bytes.NewReader(state)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// machineLimits are the limits the simulated machine keeps for a GPU, by
// cgroup, read from its state file.
func (n *node) machineLimits(t *testing.T, gpu string) map[string][2]uint64 {
	t.Helper()
	data, err := os.ReadFile(nvmock.StatePath(n.state, "dgxh100"))
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		GPUs []struct {
			UUID         string `json:"uuid"`
			MemoryLimits []struct {
				Cgroup     string `json:"cgroup"`
				Soft, Hard uint64
			} `json:"memoryLimits"`
		} `json:"gpus"`
	}
	if err := json.Unmarshal(data, &st); err != nil {
		t.Fatal(err)
	}
	out := map[string][2]uint64{}
	for _, g := range st.GPUs {
		if g.UUID == gpu {
			for _, l := range g.MemoryLimits {
				out[l.Cgroup] = [2]uint64{l.Soft, l.Hard}
			}
		}
	}
	return out
}

// memoryLimitSpec is the CDI device our handler writes for a device of
// memory bytes on gpu, on a node whose driver (r615) is under
// driverRoot as the plugin sees it and under hostRoot (the simulated
// library's root) as the host's hook sees it.
func memoryLimitSpec(t *testing.T, hook, driverRoot, hostRoot, gpu string, minor int, memory int64) specs.ContainerEdits {
	t.Helper()
	return memoryLimitSpecWith(t, hook, cdi.NVMLHook{}, driverRoot, hostRoot, gpu, minor, memory)
}

// memoryLimitSpecWith is memoryLimitSpec with an installed NVML hook.
func memoryLimitSpecWith(t *testing.T, hook string, nvmlHook cdi.NVMLHook, driverRoot, hostRoot, gpu string, minor int, memory int64) specs.ContainerEdits {
	t.Helper()
	lib, err := nvdev.Open(nvdev.Options{Backend: nvmock.Prefix + "dgxh100", MockSeed: testSeed, DriverRoot: driverRoot})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lib.Shutdown() }()
	cdiRoot := filepath.Join(t.TempDir(), "cdi")
	h, err := cdi.NewHandler(cdi.Options{CDIRoot: cdiRoot, DriverRoot: driverRoot, HostDriverRoot: hostRoot, NVML: lib.NVML(),
		CDIHookPath: hook, NVMLHook: nvmlHook, Logger: logr.Discard(), CgroupV2: func() (bool, string) { return true, "" }})
	if err != nil {
		t.Fatal(err)
	}
	if ml := h.MemoryLimits(); !ml.Enforced {
		t.Fatalf("the handler writes no memory limits: %s", ml.Reason)
	}
	if _, err := h.WriteClaimSpec("claim-1", []cdi.Device{{Name: "dev", UUID: gpu, Minor: minor, MemoryLimitBytes: memory}}); err != nil {
		t.Fatal(err)
	}
	spec, err := cdiapi.ReadSpec(cdi.SpecPath(cdiRoot, "claim-1"), 0)
	if err != nil {
		t.Fatal(err)
	}
	return spec.Devices[0].ContainerEdits
}

func memoryLimitHook(t *testing.T, edits specs.ContainerEdits) *specs.Hook {
	t.Helper()
	for _, h := range edits.Hooks {
		if strings.Contains(strings.Join(h.Args, " "), "apply-cuda-memory-limits") {
			return h
		}
	}
	t.Fatalf("no memory-limit hook in %+v", edits.Hooks)
	return nil
}

// NVIDIA's hook, run with what our spec gives a 10 GiB memory share and
// a quarter-GPU replica, sets each container's limit on its GPU in the
// simulated machine; for a MIG device the driver refuses, and so the
// hook fails (our specs never name one: the handler refuses it).
func TestNVIDIAHookSetsTheSpecsMemoryLimit(t *testing.T) {
	memoryLimitHost(t)
	n := newNode(t)
	hook := dynamicHook(t)
	unified := unifiedCgroup(t)
	driverRoot := cditest.NewDriverRoot(t, memoryLimitDriver).Root
	gpus, _, _ := n.mockInventory()
	for _, tc := range []struct {
		name   string
		gpu    int
		memory int64
	}{
		{"memory share", 5, 10 << 30},
		{"time-slice replica", 4, int64(gpus[4].MemoryBytes / 4)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			edits := memoryLimitSpec(t, hook, driverRoot, n.root, gpus[tc.gpu].UUID, tc.gpu, tc.memory)
			c := newContainer(t, unified, edits.Env)
			if out, err := n.runHook(t, memoryLimitHook(t, edits), c, driverRoot); err != nil {
				t.Fatalf("the hook failed: %v\n%s", err, out)
			}
			want := uint64(tc.memory) &^ (1<<20 - 1) // whole MiB, rounded down
			if got := n.machineLimits(t, gpus[tc.gpu].UUID)[c.cgroup]; got != [2]uint64{want, want} {
				t.Errorf("the machine's limits of %s on GPU %d = %v, want soft and hard %d", c.cgroup, tc.gpu, got, want)
			}
		})
	}

	t.Run("MIG device", func(t *testing.T) {
		var inst mig.Instance
		n.run(&inst, "mig-create", "--gpu", "2", "--profile", "1g.10gb")
		edits := memoryLimitSpec(t, hook, driverRoot, n.root, gpus[2].UUID, 2, 10<<30)
		h := memoryLimitHook(t, edits)
		h.Args[len(h.Args)-1] = inst.UUID // what the handler would never write
		c := newContainer(t, unified, edits.Env)
		out, err := n.runHook(t, h, c, driverRoot)
		if err == nil || !strings.Contains(out, inst.UUID) || !strings.Contains(out, "ERROR_NOT_SUPPORTED") {
			t.Fatalf("the hook on MIG device %s: %v\n%s\nwant it to fail, naming the device and NOT_SUPPORTED", inst.UUID, err, out)
		}
		if got := n.machineLimits(t, gpus[2].UUID); len(got) != 0 {
			t.Errorf("limits on the MIG device's GPU: %v", got)
		}
	})
}

// The hooks as the release image ships them: the static nvidia-cdi-hook
// (which cannot load NVML) named for the links and the ldcache, and the
// dynamic one installed with the image's loader and glibc (here the
// host's, as this test's "image"). The spec runs the dynamic one through
// that loader, and NVIDIA's real hook sets the share's limit on the
// simulated machine. Before the NVML hook, this node wrote no limit at all
// (HookCannotLoadNVML).
func TestTheImagesHooksSetTheSpecsMemoryLimit(t *testing.T) {
	memoryLimitHost(t)
	n := newNode(t)
	static := staticHook(t)
	nvmlHook, err := cdi.InstallNVMLHook(dynamicHook(t), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	unified := unifiedCgroup(t)
	driverRoot := cditest.NewDriverRoot(t, memoryLimitDriver).Root
	gpus, _, _ := n.mockInventory()
	const gpu, memory = 5, 6 << 30
	edits := memoryLimitSpecWith(t, static, nvmlHook, driverRoot, n.root, gpus[gpu].UUID, gpu, memory)
	h := memoryLimitHook(t, edits)
	if h.Path != nvmlHook.Loader {
		t.Fatalf("the memory-limit hook runs %s, want the installed loader %s", h.Path, nvmlHook.Loader)
	}
	c := newContainer(t, unified, edits.Env)
	if out, err := n.runHook(t, h, c, driverRoot); err != nil {
		t.Fatalf("the hook failed: %v\n%s", err, out)
	}
	if got := n.machineLimits(t, gpus[gpu].UUID)[c.cgroup]; got != [2]uint64{memory, memory} {
		t.Errorf("the machine's limits of %s on GPU %d = %v, want soft and hard %d", c.cgroup, gpu, got, memory)
	}
}
