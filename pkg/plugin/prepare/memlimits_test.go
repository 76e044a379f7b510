package prepare

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"k8s.io/klog/v2/ktesting"
	specs "tags.cncf.io/container-device-interface/specs-go"

	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/cdi"
	"github.com/gpuaas/gpu-dra-driver/pkg/cdi/cditest"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/inventory"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/prepare/preparetest"
	"github.com/gpuaas/gpu-dra-driver/test/docs"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
)

// withMemoryLimitDriver puts the env's machine on driver r615 (a driver
// install the mock pairs with), NVIDIA's hooks on, on a host whose cgroups
// are v2 as cgroupV2 says.
func withMemoryLimitDriver(t *testing.T, e *testEnv, cgroupV2 bool) {
	t.Helper()
	withMemoryLimitDriverFor(t, e, sharingNode(), cgroupV2)
}

// withMemoryLimitDriverFor is withMemoryLimitDriver with the devices cfg
// publishes.
func withMemoryLimitDriverFor(t *testing.T, e *testEnv, cfg *configapi.NodeConfig, cgroupV2 bool) {
	t.Helper()
	root := cditest.NewDriverRoot(t, "615.20.03")
	lib, err := nvdev.Open(nvdev.Options{Backend: "mock:dgxh100", MockSeed: preparetest.Node, DriverRoot: root.Root})
	if err != nil {
		t.Fatal(err)
	}
	e.Lib, e.DriverRoot, e.CDIHook = lib, root.Root, cditest.DynamicHook(t)
	e.CgroupV2 = func() (bool, string) { return cgroupV2, "cgroup v1 in this test" }
	if e.Sharing.NVML != nil {
		e.Sharing.NVML = lib
	}
	e.Devices = inventory.Discover(ktesting.NewLogger(t, ktesting.NewConfig()), lib, cfg).Devices
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

// The table "What each device enforces, on which driver" of
// docs/node-config.md says, per device, when its CDI spec carries the
// driver's memory-limit hook: "never", or "r615+, cgroup v2". Each row's
// device is prepared on an r615 node with cgroup v2 and on one without,
// and its spec must carry the hook (and NVIDIA_GPU_MEMORY_LIMIT) exactly
// where the table says.
func TestNodeConfigTableMatchesTheSpecs(t *testing.T) {
	rows := memoryLimitTable(t)
	cfg := sharingNode()
	cfg.GPUs = append(cfg.GPUs, configapi.GpuModeSelector{Indexes: []int{2}, GpuMode: configapi.GpuMode{MIG: configapi.MigDynamic}})
	claims := map[string]func(e *testEnv) *preparetest.ClaimBuilder{
		"whole GPU": func(*testEnv) *preparetest.ClaimBuilder { return preparetest.NewClaim("row").Device("gpu", "gpu-0") },
		"MIG device": func(e *testEnv) *preparetest.ClaimBuilder {
			return preparetest.NewClaim("row").Device("mig", e.Partition(t, 2, "1g.10gb"))
		},
		"time-slice replica": func(*testEnv) *preparetest.ClaimBuilder {
			return preparetest.NewClaim("row").Device("gpu", "gpu-4-ts-0")
		},
		"memory share": func(*testEnv) *preparetest.ClaimBuilder { return shareClaim("row", "10Gi") },
		"MPS client":   func(*testEnv) *preparetest.ClaimBuilder { return mpsShareClaim("row", "10Gi") },
	}
	if len(rows) != len(claims) {
		t.Errorf("the table has rows %v, want one for each of %d devices", rows, len(claims))
	}
	for device, when := range rows {
		claim, ok := claims[device]
		if !ok {
			t.Errorf("the table's row %q is no device this test knows", device)
			continue
		}
		for _, enforced := range []bool{true, false} {
			e := newTestEnvWith(t, "dgxh100", cfg)
			withTools(t, e)
			withMemoryLimitDriverFor(t, e, cfg, enforced)
			if err := os.WriteFile(e.MigMinors, []byte(preparetest.MinorsFile(8)), 0o600); err != nil {
				t.Fatal(err)
			}
			if _, err := e.state.Prepare(e.Ctx, claim(e).Build()); err != nil {
				t.Fatalf("%s: %v", device, err)
			}
			limit, gpus := memoryLimitOf(t, e, "row")
			want := when == "r615+, cgroup v2" && enforced
			if got := limit != "" && len(gpus) == 1; got != want || (limit == "") != (len(gpus) == 0) {
				t.Errorf("%s on r615 with cgroup v2 %v: limit %q, hooks for %v; the table says %q", device, enforced, limit, gpus, when)
			}
		}
	}
}

// memoryLimitTable reads the table's last column by device.
func memoryLimitTable(t *testing.T) map[string]string {
	t.Helper()
	root, err := docs.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(root, "docs", "node-config.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(data), "### What each device enforces, on which driver\n")
	if !ok {
		t.Fatal("docs/node-config.md has no section \"What each device enforces, on which driver\"")
	}
	rows := map[string]string{}
	var header []string
	for _, line := range strings.Split(strings.TrimLeft(table, "\n"), "\n") {
		if !strings.HasPrefix(line, "|") {
			break
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		switch {
		case header == nil:
			header = cells
		case strings.HasPrefix(cells[0], "---"):
		default:
			rows[cells[0]] = cells[len(cells)-1]
		}
	}
	if len(header) == 0 || header[len(header)-1] != "Memory-limit hook in the CDI spec" {
		t.Fatalf("the table's header %v: want its last column \"Memory-limit hook in the CDI spec\"", header)
	}
	for device, when := range rows {
		when, _, _ = strings.Cut(when, " (")
		if when != "never" && when != "r615+, cgroup v2" {
			t.Errorf("row %q says %q: want \"never\" or \"r615+, cgroup v2\"", device, when)
		}
		rows[device] = when
	}
	return rows
}
