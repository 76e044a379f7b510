package prepare

import (
	"slices"
	"strconv"
	"strings"
	"testing"

	"k8s.io/klog/v2/ktesting"
	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpuaas/gpu-dra-driver/pkg/cdi"
	"github.com/gpuaas/gpu-dra-driver/pkg/cdi/cditest"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/inventory"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/prepare/preparetest"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
)

// memoryLimitHookPath is where the tests' plugin installed NVIDIA's hook.
const memoryLimitHookPath = "/var/lib/kubelet/plugins/gpu.gpuaas.io/bin/nvidia-cdi-hook"

// withMemoryLimitDriver puts the env's machine on driver r615 (a driver
// install the mock pairs with), NVIDIA's hooks on, on a host whose cgroups
// are v2 as cgroupV2 says.
func withMemoryLimitDriver(t *testing.T, e *testEnv, cgroupV2 bool) {
	t.Helper()
	root := cditest.NewDriverRoot(t, "615.20.03")
	lib, err := nvdev.Open(nvdev.Options{Backend: "mock:dgxh100", MockSeed: preparetest.Node, DriverRoot: root.Root})
	if err != nil {
		t.Fatal(err)
	}
	e.Lib, e.DriverRoot, e.CDIHook = lib, root.Root, memoryLimitHookPath
	e.CgroupV2 = func() (bool, string) { return cgroupV2, "cgroup v1 in this test" }
	e.Devices = inventory.Discover(ktesting.NewLogger(t, ktesting.NewConfig()), lib, sharingNode()).Devices
	e.state = e.newState(t)
}

// memoryLimitOf is the limit a claim's spec gives its one device: the
// NVIDIA_GPU_MEMORY_LIMIT value and the GPUs its hook names; "" and nil
// for none.
func memoryLimitOf(t *testing.T, e *testEnv, uid string) (string, []string) {
	t.Helper()
	spec, err := cdiapi.ReadSpec(cdi.SpecPath(e.CDIRoot, uid), 0)
	if err != nil {
		t.Fatal(err)
	}
	edits := spec.Devices[0].ContainerEdits
	var limit string
	for _, kv := range edits.Env {
		if v, ok := strings.CutPrefix(kv, "NVIDIA_GPU_MEMORY_LIMIT="); ok {
			limit = v
		}
	}
	var gpus []string
	for _, h := range edits.Hooks {
		if slices.Contains(h.Args, "apply-cuda-memory-limits") && h.HookName == cdiapi.CreateRuntimeHook {
			gpus = append(gpus, gpuIDs(h)...)
		}
	}
	return limit, gpus
}

func gpuIDs(h *specs.Hook) []string {
	var out []string
	for i, a := range h.Args {
		if a == "--gpu-id" && i+1 < len(h.Args) {
			out = append(out, h.Args[i+1])
		}
	}
	return out
}

// On an r615 node with cgroup v2, a memory share's and a time-slice
// replica's containers are held by the driver to the device's memory (the
// share's consumed capacity; a replica's 1/N of the GPU, both in whole
// MiB); MPS devices, pinned by their daemon, and whole GPUs get no limit.
// Before, no spec carried a limit: a 10Gi share's container could fill the
// whole GPU.
func TestSharesAndReplicasCarryTheirMemoryLimit(t *testing.T) {
	e := newTestEnvWith(t, "dgxh100", sharingNode())
	withTools(t, e)
	withMemoryLimitDriver(t, e, true)
	claims := map[string]struct {
		build    *preparetest.ClaimBuilder
		gpu      int
		limitMiB string
	}{
		"share":   {build: shareClaim("share", "10Gi"), gpu: 5, limitMiB: "10240"},
		"replica": {build: preparetest.NewClaim("replica").Device("gpu", "gpu-4-ts-0"), gpu: 4, limitMiB: strconv.FormatUint(e.Lib.GPUs()[4].MemoryBytes/4>>20, 10)},
		"mps":     {build: mpsShareClaim("mps", "10Gi"), gpu: -1},
		"whole":   {build: preparetest.NewClaim("whole").Device("gpu", "gpu-0"), gpu: -1},
	}
	for uid, c := range claims {
		if _, err := e.state.Prepare(e.Ctx, c.build.Build()); err != nil {
			t.Fatalf("claim %s: %v", uid, err)
		}
		limit, gpus := memoryLimitOf(t, e, uid)
		if c.gpu < 0 {
			if limit != "" || len(gpus) != 0 {
				t.Errorf("claim %s: memory limit %q with hooks for %v, want none", uid, limit, gpus)
			}
			continue
		}
		if limit != c.limitMiB || !slices.Equal(gpus, []string{e.GPUUUID(c.gpu)}) {
			t.Errorf("claim %s: memory limit %q MiB with hooks for %v, want %s MiB on %s", uid, limit, gpus, c.limitMiB, e.GPUUUID(c.gpu))
		}
	}
}

// The limit survives a reboot: the spec written again from the record
// (the scheduler's consumed capacity is not in it) gives the same limit.
func TestMemoryLimitWrittenAgainAfterReboot(t *testing.T) {
	e := newTestEnvWith(t, "dgxh100", sharingNode())
	withTools(t, e)
	withMemoryLimitDriver(t, e, true)
	share := shareClaim("share", "10Gi").Build()
	if _, err := e.state.Prepare(e.Ctx, share); err != nil {
		t.Fatal(err)
	}
	root := e.DriverRoot
	e.rebootMachine(t, sharingNode(), true)
	lib, err := nvdev.Open(nvdev.Options{Backend: "mock:dgxh100", MockSeed: preparetest.Node, DriverRoot: root})
	if err != nil {
		t.Fatal(err)
	}
	e.Lib, e.Sharing.NVML = lib, lib
	e.Devices = inventory.Discover(ktesting.NewLogger(t, ktesting.NewConfig()), lib, sharingNode()).Devices
	restartWith(t, e, share)
	if limit, gpus := memoryLimitOf(t, e, "share"); limit != "10240" || !slices.Equal(gpus, []string{e.GPUUUID(5)}) {
		t.Errorf("after the reboot: memory limit %q MiB with hooks for %v, want 10240 MiB on %s", limit, gpus, e.GPUUUID(5))
	}
}

// On a cgroup v1 host the spec names no limit: NVIDIA's hook would fail
// every container's creation there.
func TestNoMemoryLimitOnCgroupV1(t *testing.T) {
	e := newTestEnvWith(t, "dgxh100", sharingNode())
	withTools(t, e)
	withMemoryLimitDriver(t, e, false)
	if _, err := e.state.Prepare(e.Ctx, shareClaim("share", "10Gi").Build()); err != nil {
		t.Fatal(err)
	}
	if limit, gpus := memoryLimitOf(t, e, "share"); limit != "" || len(gpus) != 0 {
		t.Errorf("memory limit %q with hooks for %v on cgroup v1, want none", limit, gpus)
	}
}
