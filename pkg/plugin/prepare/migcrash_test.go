package prepare

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/device"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/inventory"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/telemetry"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"github.com/gpuaas/gpu-dra-driver/pkg/mig"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/prepare/preparetest"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/klog/v2/ktesting"
)

// errKilled is what an injected crash panics with: the test's kill -9 at
// that point. The deferred unlocks still run, as the kernel drops a dead
// process's flocks; the mock machine keeps what was made, as a GPU would.
var errKilled = errors.New("killed")

// killedDuring runs f and reports whether it died of an injected crash.
func killedDuring(f func()) (killed bool) {
	defer func() {
		r := recover()
		if err, _ := r.(error); r != nil && !errors.Is(err, errKilled) {
			panic(r) // a real failure
		}
		killed = r != nil
	}()
	f()
	return false
}

// createStage is where in a MIG device's creation the plugin is killed.
type createStage int

const (
	afterGPUInstance     createStage = iota // before its compute instance
	afterComputeInstance                    // before Create returns
)

func (e *testEnv) mockGPU(t *testing.T, index int) *server.Device {
	t.Helper()
	// The mock server's own device, under the plugin's wrapped handle.
	dev, ret := e.Lib.NVML().DeviceGetHandleByUUID(e.GPUUUID(index))
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	return dev.(*server.Device)
}

// killDuringCreate makes the next MIG device creation on the GPU kill the
// plugin at the stage given, once what the stage names exists.
func (e *testEnv) killDuringCreate(t *testing.T, index int, stage createStage) {
	d := e.mockGPU(t, index)
	createGI := d.CreateGpuInstanceWithPlacementFunc
	d.CreateGpuInstanceWithPlacementFunc = func(info *nvml.GpuInstanceProfileInfo, pl *nvml.GpuInstancePlacement) (nvml.GpuInstance, nvml.Return) {
		d.CreateGpuInstanceWithPlacementFunc = createGI // once
		gi, ret := createGI(info, pl)
		if ret != nvml.SUCCESS {
			return gi, ret
		}
		if stage == afterGPUInstance {
			panic(errKilled)
		}
		mgi := gi.(*server.GpuInstance)
		createCI := mgi.CreateComputeInstanceFunc
		mgi.CreateComputeInstanceFunc = func(info *nvml.ComputeInstanceProfileInfo) (nvml.ComputeInstance, nvml.Return) {
			mgi.CreateComputeInstanceFunc = createCI
			ci, ret := createCI(info)
			if ret == nvml.SUCCESS {
				panic(errKilled)
			}
			return ci, ret
		}
		return gi, ret
	}
}

// gpuInstances counts a GPU's GPU instances, bare ones included, straight
// from the mock machine.
func (e *testEnv) gpuInstances(t *testing.T, index int) int {
	d := e.mockGPU(t, index)
	d.RLock()
	defer d.RUnlock()
	return len(d.GpuInstances)
}

// Item 4: the plugin is killed after creating a claim's MIG device (or
// only its GPU instance) and before recording it; the restarted plugin
// destroys it, and the kubelet's retry then prepares the claim.
func TestRestoreDestroysMIGInstanceOfInterruptedPrepare(t *testing.T) {
	for name, stage := range map[string]createStage{"after GPU instance": afterGPUInstance, "after compute instance": afterComputeInstance} {
		t.Run(name, func(t *testing.T) {
			e := newTestEnvWith(t, "dgxh100", preparetest.DynamicAll())
			claim := preparetest.NewClaim("k").Device("mig", e.Partition(t, 2, "2g.20gb")).Build()
			e.killDuringCreate(t, 2, stage)
			if !killedDuring(func() { _, _ = e.state.Prepare(e.Ctx, claim) }) {
				t.Fatal("prepare was not killed")
			}
			if n := e.gpuInstances(t, 2); n != 1 {
				t.Fatalf("the kill left %d GPU instances, want the one being made", n)
			}
			s := restartWith(t, e, claim)
			if n := e.gpuInstances(t, 2); n != 0 || e.RecordExists("k") {
				t.Fatalf("after restart: %d GPU instances, record %v; want none", n, e.RecordExists("k"))
			}
			if _, err := s.Prepare(e.Ctx, claim); err != nil {
				t.Fatalf("the kubelet's retry: %v", err)
			}
			if err := s.Unprepare(e.Ctx, "k"); err != nil || e.gpuInstances(t, 2) != 0 {
				t.Errorf("unprepare: %v, %d GPU instances left", err, e.gpuInstances(t, 2))
			}
		})
	}
}

// Item 4: the old instance of a rolling update is killed while creating a
// claim's MIG device; the kubelet retries on the new instance, whose
// prepare undoes the killed attempt's device before making its own (no
// leak, no second device, no failure on the occupied placement).
func TestRetriedPrepareUndoesMIGInstanceOfKilledAttempt(t *testing.T) {
	e := newTestEnvWith(t, "dgxh100", preparetest.DynamicAll())
	a := e.state
	b := secondInstance(t, e)
	claim := preparetest.NewClaim("k").Device("mig", e.Partition(t, 2, "3g.40gb")).Build()
	e.killDuringCreate(t, 2, afterComputeInstance)
	if !killedDuring(func() { _, _ = a.Prepare(e.Ctx, claim) }) {
		t.Fatal("prepare was not killed")
	}
	killed := e.MIGDevices(t, 2)
	if len(killed) != 1 {
		t.Fatalf("the kill left MIG devices %+v, want the one being made", killed)
	}
	if _, err := b.Prepare(e.Ctx, claim); err != nil {
		t.Fatalf("retried prepare: %v", err)
	}
	left := e.MIGDevices(t, 2)
	if len(left) != 1 || left[0].UUID == killed[0].UUID || e.gpuInstances(t, 2) != 1 {
		t.Errorf("after the retry: MIG devices %+v in %d GPU instances; want one, not the killed attempt's %s",
			left, e.gpuInstances(t, 2), killed[0].UUID)
	}
	if err := b.Unprepare(e.Ctx, "k"); err != nil || e.gpuInstances(t, 2) != 0 {
		t.Errorf("unprepare: %v, %d GPU instances left", err, e.gpuInstances(t, 2))
	}
}

// A create that fails because someone else's MIG device holds the
// placement leaves that device alone: the recorded intent is dropped once
// Create has undone its own part, so neither the rollback nor a restart
// destroys what the claim never made.
func TestFailedCreateLeavesOthersMIGDevice(t *testing.T) {
	e := newTestEnvWith(t, "dgxh100", preparetest.DynamicAll())
	name := e.Partition(t, 2, "1g.10gb")
	admin := e.adminMIG(t, 2, e.device(name).Partition().Profile, e.device(name).Partition().Placement)
	claim := preparetest.NewClaim("k").Device("mig", name).Build()
	if _, err := e.state.Prepare(e.Ctx, claim); err == nil {
		t.Fatal("prepared a MIG device on an occupied placement")
	}
	restartWith(t, e, claim)
	if left := e.MIGDevices(t, 2); len(left) != 1 || left[0].UUID != admin.UUID {
		t.Errorf("MIG devices = %+v, want the admin's %s untouched", left, admin.UUID)
	}
}

// adminMIG makes a MIG device as an admin would, behind the plugin's back.
func (e *testEnv) adminMIG(t *testing.T, index int, p mig.Profile, pl mig.Placement) mig.Instance {
	t.Helper()
	dev := e.mockGPU(t, index)
	if err := mig.EnableMigMode(dev); err != nil {
		t.Fatal(err)
	}
	inst, err := mig.Create(dev, p, pl)
	if err != nil {
		t.Fatal(err)
	}
	return inst
}

// Item 4: MIG devices that no claim owns (an admin's, and a bare GPU
// instance) are left alone at restart, counted, and their placements are
// no longer offered; the GPU's other placements and its owned device are.
func TestRestoreWithholdsPlacementsOfUnownedMIG(t *testing.T) {
	e := newTestEnvWith(t, "dgxh100", preparetest.DynamicAll())
	owned := preparetest.NewClaim("owned").Device("mig", e.PartitionAt(t, 3, "1g.10gb", 6).Name()).Build()
	if _, err := e.state.Prepare(e.Ctx, owned); err != nil {
		t.Fatal(err)
	}
	two := e.PartitionAt(t, 3, "2g.20gb", 0)
	admin := e.adminMIG(t, 3, two.Partition().Profile, two.Partition().Placement)
	e.killDuringCreate(t, 3, afterGPUInstance) // a bare GPU instance at slice 4
	one := e.PartitionAt(t, 3, "1g.10gb", 4).Partition()
	if !killedDuring(func() { _, _ = mig.Create(e.mockGPU(t, 3), one.Profile, one.Placement) }) {
		t.Fatal("no bare GPU instance made")
	}
	full := e.PartitionAt(t, 5, "7g.80gb", 0).Partition()
	e.adminMIG(t, 5, full.Profile, full.Placement)

	s := restartWith(t, e, owned)
	inv := s.Withhold(inventory.Discover(ktesting.NewLogger(t, ktesting.NewConfig()), e.Lib, preparetest.DynamicAll()))

	if e.gpuInstances(t, 3) != 3 || !slices.ContainsFunc(e.MIGDevices(t, 3), func(i mig.Instance) bool { return i == admin }) {
		t.Errorf("restart destroyed unowned MIG devices: %d GPU instances left, want 3", e.gpuInstances(t, 3))
	}
	if got := testutil.ToFloat64(e.Metrics.UnownedMIG.WithLabelValues(e.GPUUUID(3))); got != 2 {
		t.Errorf("unowned_mig_instances{GPU 3} = %v, want 2", got)
	}
	for gpu, want := range map[int]float64{4: 0, 5: 1} {
		if got := testutil.ToFloat64(e.Metrics.UnownedMIG.WithLabelValues(e.GPUUUID(gpu))); got != want {
			t.Errorf("unowned_mig_instances{GPU %d} = %v, want %v", gpu, got, want)
		}
	}
	checkWithheld(t, e, inv)
	// ... and the Node says so, once per GPU with unowned devices.
	if got := e.Events.WithReason(telemetry.ReasonUnownedMIGDevices); len(got) != 2 ||
		!strings.Contains(strings.Join(got, "\n"), "GPU "+e.GPUUUID(3)+" has 2 MIG device(s) that no claim owns") {
		t.Errorf("Node events %q, want one for GPU 3 (2 devices) and one for GPU 5", got)
	}
	if _, err := s.Prepare(e.Ctx, preparetest.NewClaim("held").Device("mig", two.Name()).Build()); err == nil {
		t.Error("prepared a device at an unowned MIG device's placement")
	}
	if _, err := s.Prepare(e.Ctx, preparetest.NewClaim("free").Device("mig", e.PartitionAt(t, 3, "1g.10gb", 2).Name()).Build()); err != nil {
		t.Errorf("a free placement beside unowned MIG devices: %v", err)
	}
}

// checkWithheld checks what the node offers: of GPU 3 (unowned 2g.20gb at
// slices 0-1 and a bare 1g.10gb at slice 4, a claim's 1g.10gb at slice 6)
// what does not overlap them; of GPU 5 (an unowned 7g.80gb) nothing; of
// the other GPUs everything.
func checkWithheld(t *testing.T, e *testEnv, inv inventory.Inventory) {
	t.Helper()
	published := map[string]bool{}
	for _, d := range inv.Devices {
		published[d.Name()] = true
	}
	for _, d := range e.Devices {
		p := d.Partition()
		occupied := p != nil && d.GPU.Index == 3 && (p.Placement.Overlaps(mig.Placement{Start: 0, Size: 2}) || p.Placement.Overlaps(mig.Placement{Start: 4, Size: 1}))
		want := !occupied && d.Name() != device.GPUDeviceName(3) && d.GPU.Index != 5
		if published[d.Name()] != want {
			t.Errorf("%s published: %v, want %v", d.Name(), published[d.Name()], want)
		}
	}
	for _, cs := range inv.CounterSets {
		if cs.Name != mig.CounterSetName(3) {
			continue
		}
		for slice, want := range map[int]int64{0: 0, 1: 0, 2: 1, 4: 0, 6: 1} {
			c := cs.Counters[mig.MemorySliceCounter(slice)]
			if got := c.Value.Value(); got != want {
				t.Errorf("counter %s = %d, want %d", mig.MemorySliceCounter(slice), got, want)
			}
		}
	}
	checkSlicesPerGPU(t, inv, 1+7+1)
}

// checkSlicesPerGPU checks that each dynamic MIG GPU still has a slice of
// its own, and that the counter sets are all still there. The last slice
// holds every GPU's deferred devices (mig.Layout.Deferred), which the
// plugin lists after all others so that first fit packs.
func checkSlicesPerGPU(t *testing.T, inv inventory.Inventory, want int) {
	t.Helper()
	pool := inventory.Resources(testNode, inv).Pools[testNode]
	if len(pool.Slices) != want || len(pool.Slices[0].SharedCounters) != 8 {
		t.Fatalf("%d slices, the first with %d counter sets; want %d slices, the first with all 8 sets",
			len(pool.Slices), len(pool.Slices[0].SharedCounters), want)
	}
	last := pool.Slices[len(pool.Slices)-1]
	for _, d := range last.Devices {
		if !strings.Contains(d.Name, "-mig-3g40gb-0") {
			t.Errorf("last slice holds %s, not only deferred devices", d.Name)
		}
	}
	for i, s := range pool.Slices[1 : len(pool.Slices)-1] {
		gpu := strings.Join(strings.SplitN(s.Devices[0].Name, "-", 3)[:2], "-")
		for _, d := range s.Devices {
			if !strings.HasPrefix(d.Name+"-", gpu+"-") {
				t.Errorf("slice %d holds %s and %s", i+1, s.Devices[0].Name, d.Name)
			}
		}
	}
}
