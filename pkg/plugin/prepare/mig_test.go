package prepare

import (
	"fmt"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/inventory"

	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/mig"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/checkpoint"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/device"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/klog/v2/ktesting"
)

func dynamicAll() *configapi.NodeConfig {
	return &configapi.NodeConfig{Default: configapi.GpuMode{MIG: configapi.MigDynamic}}
}

func (e *testEnv) migDevices(t *testing.T, gpuIndex int) []mig.Instance {
	t.Helper()
	dev, err := e.lib.DeviceByUUID(e.lib.GPUs()[gpuIndex].UUID)
	if err != nil {
		t.Fatal(err)
	}
	insts, err := mig.List(dev)
	if err != nil {
		t.Fatal(err)
	}
	return insts
}

// firstPartition returns the name of the first published partition of a
// profile on a GPU.
func (e *testEnv) partition(t *testing.T, gpuIndex int, profile string) string {
	t.Helper()
	for _, d := range e.devices {
		if d.Partition() != nil && d.GPU.Index == gpuIndex && d.Partition().Profile.Name == profile {
			return d.Name()
		}
	}
	t.Fatalf("no %s partition on GPU %d", profile, gpuIndex)
	return ""
}

func TestDynamicMIGInventory(t *testing.T) {
	e := newTestEnvWith(t, "dgxh100", dynamicAll())
	inv := inventory.Discover(ktesting.NewLogger(t, ktesting.NewConfig()), e.lib, dynamicAll())
	pool := inventory.Resources(testNode, inv).Pools[testNode]
	// One slice per GPU, then one of every GPU's deferred devices (the
	// lower 3g.40gb, listed last so first fit packs: mig.Layout.Deferred).
	if len(inv.CounterSets) != 8 || len(pool.Slices) != 1+8+1 {
		t.Fatalf("%d counter sets in %d slices, want 8 sets, 1 counter slice + 8 device slices + 1 of deferred devices", len(inv.CounterSets), len(pool.Slices))
	}
	if len(pool.Slices[0].SharedCounters) != 8 || len(pool.Slices[0].Devices) != 0 {
		t.Errorf("first slice must hold only the counter sets")
	}
	deferred := pool.Slices[9].Devices
	if len(deferred) != 8 {
		t.Errorf("last slice holds %d devices, want the 8 GPUs' lower 3g.40gb", len(deferred))
	}
	for i, d := range deferred {
		if d.Name != fmt.Sprintf("gpu-%d-mig-3g40gb-0", i) || d.ConsumesCounters[0].CounterSet != mig.CounterSetName(i) {
			t.Errorf("deferred device %d: %s consuming %s", i, d.Name, d.ConsumesCounters[0].CounterSet)
		}
	}
	for i, s := range pool.Slices[1:9] {
		if len(s.Devices) > inventory.MaxDevicesPerSlice || len(s.SharedCounters) != 0 {
			t.Errorf("slice %d: %d devices, %d counter sets", i+1, len(s.Devices), len(s.SharedCounters))
		}
		whole := s.Devices[0]
		if whole.Name != device.GPUDeviceName(i) || len(whole.ConsumesCounters) != 1 {
			t.Errorf("slice %d does not start with the whole GPU consuming its counters: %s", i+1, whole.Name)
		}
		for _, d := range s.Devices[1:] {
			if *d.Attributes["type"].StringValue != "mig" || !strings.HasPrefix(d.Name, fmt.Sprintf("gpu-%d-mig-", i)) {
				t.Errorf("slice %d holds %s", i+1, d.Name)
			}
			if d.ConsumesCounters[0].CounterSet != whole.ConsumesCounters[0].CounterSet {
				t.Errorf("%s consumes counter set %s", d.Name, d.ConsumesCounters[0].CounterSet)
			}
		}
	}
}

func TestDynamicMIGPrepareCreatesAndUnprepareDestroys(t *testing.T) {
	e := newTestEnvWith(t, "dgxh100", dynamicAll())
	if err := os.WriteFile(e.migMinors, []byte(minorsFile(8)), 0o600); err != nil {
		t.Fatal(err)
	}
	name := e.partition(t, 2, "1g.10gb")
	devs, err := e.state.Prepare(e.ctx, newClaim("m").device("mig", name).build())
	if err != nil {
		t.Fatalf("Prepare: %v", err)
	}
	insts := e.migDevices(t, 2)
	if len(insts) != 1 || insts[0].Profile != "1g.10gb" {
		t.Fatalf("MIG devices after prepare: %+v", insts)
	}
	spec, _ := os.ReadFile(cdiSpecPath(e, "m"))
	if !strings.Contains(string(spec), insts[0].UUID) || !strings.Contains(string(spec), "/dev/nvidia-caps/nvidia-cap") {
		t.Errorf("CDI spec lacks the MIG UUID or its capability nodes: %s", spec)
	}
	if strings.Contains(string(spec), e.lib.GPUs()[2].UUID) {
		t.Errorf("CDI spec exposes the parent GPU's UUID")
	}
	checkSpecParses(t, e, "m", devs[0].CDIDeviceIDs...)
	if err := e.state.Unprepare(e.ctx, "m"); err != nil {
		t.Fatal(err)
	}
	if left := e.migDevices(t, 2); len(left) != 0 {
		t.Errorf("MIG devices left after unprepare: %+v", left)
	}
}

// minorsFile fakes /proc/driver/nvidia-caps/mig-minors for a few GPUs.
func minorsFile(gpus int) string {
	var b strings.Builder
	minor := 1
	for g := range gpus {
		for gi := range 8 {
			fmt.Fprintf(&b, "gpu%d/gi%d/access %d\n", g, gi, minor)
			minor++
			for ci := range 8 {
				fmt.Fprintf(&b, "gpu%d/gi%d/ci%d/access %d\n", g, gi, ci, minor)
				minor++
			}
		}
	}
	return b.String()
}

func cdiSpecPath(e *testEnv, uid string) string {
	return e.cdiRoot + "/k8s.gpu.gpuaas.io-claim_" + uid + ".json"
}

func TestDynamicMIGRollbackOnFailure(t *testing.T) {
	// Two overlapping placements in one claim: the scheduler never does
	// this (counters), but it makes the second create fail after the first
	// succeeded, which is the half-way failure to roll back.
	e := newTestEnvWith(t, "dgxh100", dynamicAll())
	var a, b string
	for _, d := range e.devices {
		if d.Partition() == nil || d.GPU.Index != 1 {
			continue
		}
		if d.Partition().Profile.Name == "7g.80gb" {
			a = d.Name()
		}
		if d.Partition().Profile.Name == "1g.10gb" && b == "" {
			b = d.Name()
		}
	}
	_, err := e.state.Prepare(e.ctx, newClaim("r").device("big", a).device("small", b).build())
	if err == nil {
		t.Fatal("prepare of overlapping MIG devices succeeded")
	}
	if left := e.migDevices(t, 1); len(left) != 0 {
		t.Errorf("rollback left MIG devices: %+v", left)
	}
	if e.recordExists("r") || e.cdiSpecExists("r") {
		t.Error("rollback left a record or CDI spec")
	}
}

func TestDynamicMIGWholeGPUSwitchesMIGOff(t *testing.T) {
	e := newTestEnvWith(t, "dgxh100", dynamicAll())
	name := e.partition(t, 0, "3g.40gb")
	if _, err := e.state.Prepare(e.ctx, newClaim("m").device("mig", name).build()); err != nil {
		t.Fatal(err)
	}
	if err := e.state.Unprepare(e.ctx, "m"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.state.Prepare(e.ctx, newClaim("w").device("gpu", "gpu-0").build()); err != nil {
		t.Fatalf("whole GPU after MIG: %v", err)
	}
	dev, _ := e.lib.DeviceByUUID(e.lib.GPUs()[0].UUID)
	if mode, _, _ := dev.GetMigMode(); mode != 0 {
		t.Errorf("MIG mode still %d for a whole-GPU claim", mode)
	}
}

func TestRestartUndoesInterruptedMIGPrepare(t *testing.T) {
	e := newTestEnvWith(t, "dgxh100", dynamicAll())
	name := e.partition(t, 3, "2g.20gb")
	if _, err := e.state.Prepare(e.ctx, newClaim("half").device("mig", name).build()); err != nil {
		t.Fatal(err)
	}
	// Turn the record back into what a crash before completion leaves.
	rec := e.state.index.get("half")
	rec.State = checkpoint.PrepareStarted
	if err := e.state.env.Store.Save(rec); err != nil {
		t.Fatal(err)
	}
	restartWith(t, e, newClaim("half").build())
	if left := e.migDevices(t, 3); len(left) != 0 {
		t.Errorf("interrupted prepare left MIG devices: %+v", left)
	}
}

func TestRestartDestroysMIGOfDeletedClaims(t *testing.T) {
	e := newTestEnvWith(t, "dgxh100", dynamicAll())
	live := newClaim("live").device("mig", e.partition(t, 4, "1g.10gb")).build()
	gone := newClaim("gone").device("mig", e.partition(t, 5, "1g.10gb")).build()
	for _, c := range []*resourceapi.ResourceClaim{live, gone} {
		if _, err := e.state.Prepare(e.ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	restartWith(t, e, live)
	if n := len(e.migDevices(t, 4)); n != 1 {
		t.Errorf("live claim's MIG device: %d, want 1", n)
	}
	if n := len(e.migDevices(t, 5)); n != 0 {
		t.Errorf("deleted claim's MIG device not destroyed: %d left", n)
	}
}

func TestStaticMIGIsNeverCreatedOrDestroyed(t *testing.T) {
	base := newTestEnv(t, "dgxh100")
	dev, _ := base.lib.DeviceByUUID(base.lib.GPUs()[6].UUID)
	if err := mig.EnableMigMode(dev); err != nil {
		t.Fatal(err)
	}
	profiles, _ := mig.Profiles(dev)
	p, _ := mig.ProfileByName(profiles, "3g.40gb")
	if _, err := mig.Create(dev, p, p.Placements[0]); err != nil {
		t.Fatal(err)
	}
	// Re-open: the GPU now reports MIG mode on, as after the admin's change.
	cfg := &configapi.NodeConfig{GPUs: []configapi.GpuModeSelector{{Indexes: []int{6}, GpuMode: configapi.GpuMode{MIG: configapi.MigStatic}}}}
	gpus := base.lib.GPUs()
	gpus[6].MigEnabled = true
	e := &testEnv{lib: base.lib, cdiRoot: base.cdiRoot, ckptDir: base.ckptDir, migMinors: base.migMinors, ctx: base.ctx}
	e.devices = inventory.Discover(ktesting.NewLogger(t, ktesting.NewConfig()), base.lib, cfg).Devices
	e.state = e.newState(t)
	var static string
	for _, d := range e.devices {
		if d.GPU.Index == 6 {
			if d.StaticInstance() == nil {
				t.Fatalf("GPU 6 offers %s, want only its existing MIG device", d.Name())
			}
			static = d.Name()
		}
	}
	if _, err := e.state.Prepare(e.ctx, newClaim("s").device("mig", static).build()); err != nil {
		t.Fatal(err)
	}
	if n := len(e.migDevices(t, 6)); n != 1 {
		t.Errorf("static prepare changed MIG devices: %d", n)
	}
	if err := e.state.Unprepare(e.ctx, "s"); err != nil {
		t.Fatal(err)
	}
	if n := len(e.migDevices(t, 6)); n != 1 {
		t.Errorf("static unprepare destroyed the admin's MIG device")
	}
}

func TestAmpereDynamicWithoutAdminFallsBackToWhole(t *testing.T) {
	e := newTestEnvWith(t, "dgxa100", dynamicAll())
	for _, d := range e.devices {
		// A whole GPU consumes only its milliunits, from its unit-only set.
		units := mig.MilliunitsConsumption(mig.CounterSetName(d.GPU.Index), mig.GPUMilliunits)
		if d.Type() != device.TypeGPU || d.Kind.ModeName() != "" || !reflect.DeepEqual(d.API.ConsumesCounters, units) {
			t.Fatalf("A100 with MIG off offered %s (mode %q, consuming %v) under dynamic MIG; want whole GPUs", d.Name(), d.Kind.ModeName(), d.API.ConsumesCounters)
		}
	}
	if len(e.devices) != 8 {
		t.Errorf("%d devices, want 8 whole GPUs", len(e.devices))
	}
}

func TestModeChangeOfBusyGPUIsRefused(t *testing.T) {
	e := newTestEnvWith(t, "dgxh100", dynamicAll())
	if _, err := e.state.Prepare(e.ctx, newClaim("busy").device("mig", e.partition(t, 0, "1g.10gb")).build()); err != nil {
		t.Fatal(err)
	}
	records, _, _ := e.state.env.Store.LoadAll()
	logger := ktesting.NewLogger(t, ktesting.NewConfig())
	cfg := device.PinModes(logger, &configapi.NodeConfig{}, e.lib.GPUs(), records) // admin asks for "whole" everywhere
	inv := inventory.Discover(logger, e.lib, cfg)
	modes := map[int]string{}
	for _, d := range inv.Devices {
		modes[d.GPU.Index] = d.Kind.ModeName()
	}
	if modes[0] != string(configapi.MigDynamic) || modes[1] != "" {
		t.Errorf("modes after the change = %v, want GPU 0 kept dynamic, GPU 1 whole", modes)
	}
}
