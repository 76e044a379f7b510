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
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/prepare/preparetest"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/klog/v2/ktesting"
)

func TestDynamicMIGInventory(t *testing.T) {
	e := newTestEnvWith(t, "dgxh100", preparetest.DynamicAll())
	inv := inventory.Discover(ktesting.NewLogger(t, ktesting.NewConfig()), e.Lib, preparetest.DynamicAll())
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
	e := newTestEnvWith(t, "dgxh100", preparetest.DynamicAll())
	if err := os.WriteFile(e.MigMinors, []byte(preparetest.MinorsFile(8)), 0o600); err != nil {
		t.Fatal(err)
	}
	name := e.Partition(t, 2, "1g.10gb")
	devs, err := e.state.Prepare(e.Ctx, preparetest.NewClaim("m").Device("mig", name).Build())
	if err != nil {
		t.Fatalf("Prepare: %v", err)
	}
	insts := e.MIGDevices(t, 2)
	if len(insts) != 1 || insts[0].Profile != "1g.10gb" {
		t.Fatalf("MIG devices after prepare: %+v", insts)
	}
	spec, _ := os.ReadFile(cdiSpecPath(e, "m"))
	if !strings.Contains(string(spec), insts[0].UUID) || !strings.Contains(string(spec), "/dev/nvidia-caps/nvidia-cap") {
		t.Errorf("CDI spec lacks the MIG UUID or its capability nodes: %s", spec)
	}
	if strings.Contains(string(spec), e.Lib.GPUs()[2].UUID) {
		t.Errorf("CDI spec exposes the parent GPU's UUID")
	}
	checkSpecParses(t, e, "m", devs[0].CDIDeviceIDs...)
	if err := e.state.Unprepare(e.Ctx, "m"); err != nil {
		t.Fatal(err)
	}
	if left := e.MIGDevices(t, 2); len(left) != 0 {
		t.Errorf("MIG devices left after unprepare: %+v", left)
	}
}

func cdiSpecPath(e *testEnv, uid string) string {
	return e.CDIRoot + "/k8s.gpu.gpuaas.io-claim_" + uid + ".json"
}

func TestDynamicMIGRollbackOnFailure(t *testing.T) {
	// Two overlapping placements in one claim: the scheduler never does
	// this (counters), but it makes the second create fail after the first
	// succeeded, which is the half-way failure to roll back.
	e := newTestEnvWith(t, "dgxh100", preparetest.DynamicAll())
	var a, b string
	for _, d := range e.Devices {
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
	_, err := e.state.Prepare(e.Ctx, preparetest.NewClaim("r").Device("big", a).Device("small", b).Build())
	if err == nil {
		t.Fatal("prepare of overlapping MIG devices succeeded")
	}
	if left := e.MIGDevices(t, 1); len(left) != 0 {
		t.Errorf("rollback left MIG devices: %+v", left)
	}
	if e.RecordExists("r") || e.CDISpecExists("r") {
		t.Error("rollback left a record or CDI spec")
	}
}

func TestDynamicMIGWholeGPUSwitchesMIGOff(t *testing.T) {
	e := newTestEnvWith(t, "dgxh100", preparetest.DynamicAll())
	name := e.Partition(t, 0, "3g.40gb")
	if _, err := e.state.Prepare(e.Ctx, preparetest.NewClaim("m").Device("mig", name).Build()); err != nil {
		t.Fatal(err)
	}
	if err := e.state.Unprepare(e.Ctx, "m"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.state.Prepare(e.Ctx, preparetest.NewClaim("w").Device("gpu", "gpu-0").Build()); err != nil {
		t.Fatalf("whole GPU after MIG: %v", err)
	}
	dev, _ := e.Lib.DeviceByUUID(e.Lib.GPUs()[0].UUID)
	if mode, _, _ := dev.GetMigMode(); mode != 0 {
		t.Errorf("MIG mode still %d for a whole-GPU claim", mode)
	}
}

func TestRestartUndoesInterruptedMIGPrepare(t *testing.T) {
	e := newTestEnvWith(t, "dgxh100", preparetest.DynamicAll())
	name := e.Partition(t, 3, "2g.20gb")
	if _, err := e.state.Prepare(e.Ctx, preparetest.NewClaim("half").Device("mig", name).Build()); err != nil {
		t.Fatal(err)
	}
	// Turn the record back into what a crash before completion leaves.
	rec := e.state.index.get("half")
	rec.State = checkpoint.PrepareStarted
	if err := e.state.env.Store.Save(rec); err != nil {
		t.Fatal(err)
	}
	restartWith(t, e, preparetest.NewClaim("half").Build())
	if left := e.MIGDevices(t, 3); len(left) != 0 {
		t.Errorf("interrupted prepare left MIG devices: %+v", left)
	}
}

func TestRestartDestroysMIGOfDeletedClaims(t *testing.T) {
	e := newTestEnvWith(t, "dgxh100", preparetest.DynamicAll())
	live := preparetest.NewClaim("live").Device("mig", e.Partition(t, 4, "1g.10gb")).Build()
	gone := preparetest.NewClaim("gone").Device("mig", e.Partition(t, 5, "1g.10gb")).Build()
	for _, c := range []*resourceapi.ResourceClaim{live, gone} {
		if _, err := e.state.Prepare(e.Ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	restartWith(t, e, live)
	if n := len(e.MIGDevices(t, 4)); n != 1 {
		t.Errorf("live claim's MIG device: %d, want 1", n)
	}
	if n := len(e.MIGDevices(t, 5)); n != 0 {
		t.Errorf("deleted claim's MIG device not destroyed: %d left", n)
	}
}

func TestStaticMIGIsNeverCreatedOrDestroyed(t *testing.T) {
	base := newTestEnv(t, "dgxh100")
	dev, _ := base.Lib.DeviceByUUID(base.Lib.GPUs()[6].UUID)
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
	gpus := base.Lib.GPUs()
	gpus[6].MigEnabled = true
	e := &testEnv{Env: &preparetest.Env{Lib: base.Lib, CDIRoot: base.CDIRoot, CkptDir: base.CkptDir, MigMinors: base.MigMinors, Ctx: base.Ctx}}
	e.Devices = inventory.Discover(ktesting.NewLogger(t, ktesting.NewConfig()), base.Lib, cfg).Devices
	e.state = e.newState(t)
	var static string
	for _, d := range e.Devices {
		if d.GPU.Index == 6 {
			if d.StaticInstance() == nil {
				t.Fatalf("GPU 6 offers %s, want only its existing MIG device", d.Name())
			}
			static = d.Name()
		}
	}
	if _, err := e.state.Prepare(e.Ctx, preparetest.NewClaim("s").Device("mig", static).Build()); err != nil {
		t.Fatal(err)
	}
	if n := len(e.MIGDevices(t, 6)); n != 1 {
		t.Errorf("static prepare changed MIG devices: %d", n)
	}
	if err := e.state.Unprepare(e.Ctx, "s"); err != nil {
		t.Fatal(err)
	}
	if n := len(e.MIGDevices(t, 6)); n != 1 {
		t.Errorf("static unprepare destroyed the admin's MIG device")
	}
}

func TestAmpereDynamicWithoutAdminFallsBackToWhole(t *testing.T) {
	e := newTestEnvWith(t, "dgxa100", preparetest.DynamicAll())
	for _, d := range e.Devices {
		// A whole GPU consumes only its milliunits, from its unit-only set.
		units := mig.MilliunitsConsumption(mig.CounterSetName(d.GPU.Index), mig.GPUMilliunits)
		if d.Type() != device.TypeGPU || d.Kind.ModeName() != "" || !reflect.DeepEqual(d.API.ConsumesCounters, units) {
			t.Fatalf("A100 with MIG off offered %s (mode %q, consuming %v) under dynamic MIG; want whole GPUs", d.Name(), d.Kind.ModeName(), d.API.ConsumesCounters)
		}
	}
	if len(e.Devices) != 8 {
		t.Errorf("%d devices, want 8 whole GPUs", len(e.Devices))
	}
}

func TestModeChangeOfBusyGPUIsRefused(t *testing.T) {
	e := newTestEnvWith(t, "dgxh100", preparetest.DynamicAll())
	if _, err := e.state.Prepare(e.Ctx, preparetest.NewClaim("busy").Device("mig", e.Partition(t, 0, "1g.10gb")).Build()); err != nil {
		t.Fatal(err)
	}
	records, _, _ := e.state.env.Store.LoadAll()
	logger := ktesting.NewLogger(t, ktesting.NewConfig())
	cfg, _ := device.PinModes(logger, &configapi.NodeConfig{}, e.Lib.GPUs(), records) // admin asks for "whole" everywhere
	inv := inventory.Discover(logger, e.Lib, cfg)
	modes := map[int]string{}
	for _, d := range inv.Devices {
		modes[d.GPU.Index] = d.Kind.ModeName()
	}
	if modes[0] != string(configapi.MigDynamic) || modes[1] != "" {
		t.Errorf("modes after the change = %v, want GPU 0 kept dynamic, GPU 1 whole", modes)
	}
}
