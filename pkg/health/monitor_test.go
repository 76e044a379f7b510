package health_test

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"github.com/gpuaas/gpu-dra-driver/pkg/health"
	"github.com/gpuaas/gpu-dra-driver/pkg/mig"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
	_ "github.com/gpuaas/gpu-dra-driver/pkg/nvdev/nvmock" // the mock:<machine> backends
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/klog/v2/ktesting"
)

// fakeNode is a mock machine whose NVML event set delivers what the test
// sends, and whose GPUs stop answering when the test says so.
type fakeNode struct {
	lib    nvdev.Interface
	srv    *server.Server
	events chan nvml.EventData
	mu     sync.Mutex
	lost   map[string]bool
	clock  *fakeClock
}

type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Step(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func newFakeNode(t *testing.T) *fakeNode {
	t.Helper()
	lib, err := nvdev.Open(nvdev.Options{Backend: "mock:dgxa100", MockSeed: "node-a"})
	if err != nil {
		t.Fatal(err)
	}
	n := &fakeNode{lib: lib, srv: lib.NVML().(*server.Server), events: make(chan nvml.EventData, 16),
		lost: map[string]bool{}, clock: &fakeClock{now: time.Unix(1_700_000_000, 0)}}
	n.srv.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) {
		return &mock.EventSet{
			WaitFunc: func(timeoutMs uint32) (nvml.EventData, nvml.Return) {
				select {
				case e := <-n.events:
					return e, nvml.SUCCESS
				case <-time.After(time.Duration(timeoutMs) * time.Millisecond):
					return nvml.EventData{}, nvml.ERROR_TIMEOUT
				}
			},
			FreeFunc: func() nvml.Return { return nvml.SUCCESS },
		}, nvml.SUCCESS
	}
	for _, d := range n.srv.Devices {
		dev := d.(*server.Device)
		memInfo := dev.GetMemoryInfoFunc
		dev.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
			n.mu.Lock()
			defer n.mu.Unlock()
			if n.lost[dev.UUID] {
				return nvml.Memory{}, nvml.ERROR_GPU_IS_LOST
			}
			return memInfo()
		}
	}
	return n
}

func (n *fakeNode) gpu(i int) (nvml.Device, string) {
	d := n.srv.Devices[i].(*server.Device)
	return d, d.UUID
}

func (n *fakeNode) setLost(uuid string, lost bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.lost[uuid] = lost
}

// start runs a monitor until the test ends; changes counts its OnChange calls.
func (n *fakeNode) start(t *testing.T, cfg health.Config) (*health.Monitor, chan struct{}) {
	t.Helper()
	cfg.Now = n.clock.Now
	cfg.ProbeInterval = time.Millisecond
	m := health.New(n.lib, cfg, nil)
	changes := make(chan struct{}, 100)
	m.OnChange(func() { changes <- struct{}{} })
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { m.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return m, changes
}

// waitFor polls the monitor's faults until cond holds.
func waitFor(t *testing.T, m *health.Monitor, what string, cond func([]health.Fault) bool) []health.Fault {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		f := m.Faults()
		if cond(f) {
			return f
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s; faults: %+v", what, f)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func xid(dev nvml.Device, code uint64) nvml.EventData {
	return nvml.EventData{Device: dev, EventType: nvml.EventTypeXidCriticalError, EventData: code,
		GpuInstanceId: 0xFFFFFFFF, ComputeInstanceId: 0xFFFFFFFF}
}

func count(n int) func([]health.Fault) bool {
	return func(f []health.Fault) bool { return len(f) == n }
}

func TestCriticalXIDTaintsTheGPUUntilTheQuietPeriodPasses(t *testing.T) {
	n := newFakeNode(t)
	m, _ := n.start(t, health.Config{QuietPeriod: time.Minute})
	dev, uuid := n.gpu(3)
	n.events <- xid(dev, 62) // transient
	f := waitFor(t, m, "the XID fault", count(1))[0]
	if f.GPU != uuid || f.Kind != health.KindXID || f.Value != "62" || f.MIG != nil || f.Effect != resourceapi.DeviceTaintEffectNoSchedule {
		t.Fatalf("fault = %+v", f)
	}
	n.clock.Step(59 * time.Second)
	n.events <- xid(dev, 62) // seen again: the quiet period starts over
	// Once the monitor has taken the repeat in: a fixed sleep here let a
	// loaded machine step the clock past the first quiet period first.
	waitFor(t, m, "the repeat to renew the fault", func(faults []health.Fault) bool {
		return len(faults) == 1 && faults[0].Until.After(f.Until)
	})
	n.clock.Step(30 * time.Second)
	time.Sleep(50 * time.Millisecond)
	if len(m.Faults()) != 1 {
		t.Fatalf("fault cleared within the quiet period of its repeat")
	}
	n.clock.Step(31 * time.Second)
	waitFor(t, m, "the quiet period to clear the fault", count(0))
}

func TestApplicationXIDIsNotAFault(t *testing.T) {
	n := newFakeNode(t)
	m, _ := n.start(t, health.Config{})
	dev, _ := n.gpu(0)
	n.events <- xid(dev, 31) // a program's page fault
	n.events <- xid(dev, 48) // double-bit ECC: reset required
	f := waitFor(t, m, "the ECC XID", count(1))[0]
	if f.Value != "48" {
		t.Fatalf("fault = %+v, want only XID 48", f)
	}
}

func TestResetRequiredXIDClearsOnlyWhenTheGPUComesBack(t *testing.T) {
	n := newFakeNode(t)
	m, _ := n.start(t, health.Config{QuietPeriod: time.Second, NoExecute: []string{health.KindGPULost}})
	dev, uuid := n.gpu(1)
	n.events <- xid(dev, 79)
	waitFor(t, m, "XID 79", count(1))
	n.clock.Step(time.Hour) // no quiet period for a GPU that fell off the bus
	time.Sleep(50 * time.Millisecond)
	n.setLost(uuid, true)
	faults := waitFor(t, m, "gpu-lost", count(2))
	for _, f := range faults {
		if f.Kind == health.KindGPULost && f.Effect != resourceapi.DeviceTaintEffectNoExecute {
			t.Fatalf("gpu-lost effect = %s, want NoExecute as configured", f.Effect)
		}
	}
	n.setLost(uuid, false)
	waitFor(t, m, "the GPU answering again to clear both", count(0))
}

func TestMIGScopedXIDNamesThePlacement(t *testing.T) {
	n := newFakeNode(t)
	m, _ := n.start(t, health.Config{})
	dev, _ := n.gpu(2)
	if _, ret := dev.SetMigMode(nvml.DEVICE_MIG_ENABLE); ret != nvml.SUCCESS {
		t.Fatal(nvml.ErrorString(ret))
	}
	profiles, err := mig.Profiles(dev)
	if err != nil {
		t.Fatal(err)
	}
	p, ok := mig.ProfileByName(profiles, "1g.5gb")
	if !ok {
		t.Fatalf("no 1g.5gb in %v", profiles)
	}
	inst, err := mig.Create(dev, p, mig.Placement{Start: 3, Size: 1})
	if err != nil {
		t.Fatal(err)
	}
	e := xid(dev, 94)
	e.GpuInstanceId = uint32(inst.GIID)
	n.events <- e
	f := waitFor(t, m, "the MIG-scoped XID", count(1))[0]
	if f.MIG == nil || f.MIG.Placement != inst.Placement || f.MIG.GIProfileID != p.GIProfileID {
		t.Fatalf("scope = %+v, want profile %d at %+v", f.MIG, p.GIProfileID, inst.Placement)
	}
}

func TestCleanupBlockedUntilARetrySucceeds(t *testing.T) {
	n := newFakeNode(t)
	m, changes := n.start(t, health.Config{})
	_, uuid := n.gpu(5)
	scope := &health.MIGScope{GIProfileID: 0, Placement: mig.Placement{Start: 6, Size: 1}}
	_, ctx := ktesting.NewTestContext(t)
	m.SetCleanupBlocked(ctx, uuid, scope, errInUse)
	f := waitFor(t, m, "cleanup-blocked", count(1))[0]
	if f.Kind != health.KindCleanupBlocked || !f.Unhealthy() {
		t.Fatalf("fault = %+v", f)
	}
	m.SetCleanupBlocked(ctx, uuid, scope, errInUse) // a failed retry changes nothing
	m.SetCleanupBlocked(ctx, uuid, &health.MIGScope{Placement: mig.Placement{Start: 5, Size: 1}}, nil)
	if len(m.Faults()) != 1 {
		t.Fatal("success elsewhere cleared the fault")
	}
	m.SetCleanupBlocked(ctx, uuid, scope, nil)
	waitFor(t, m, "the retry to clear it", count(0))
	if got := len(changes); got != 2 {
		t.Fatalf("OnChange called %d times, want 2 (blocked, cleared)", got)
	}
}

var errInUse = &nvmlError{nvml.ERROR_IN_USE}

type nvmlError struct{ ret nvml.Return }

func (e *nvmlError) Error() string { return nvml.ErrorString(e.ret) }

func TestClassifyXID(t *testing.T) {
	for xid, want := range map[uint64]health.XIDClass{
		13: health.XIDApplication, 43: health.XIDApplication, 79: health.XIDResetRequired,
		48: health.XIDResetRequired, 94: health.XIDTransient, 999: health.XIDTransient,
	} {
		if got := health.ClassifyXID(xid); got != want {
			t.Errorf("ClassifyXID(%d) = %s, want %s", xid, got, want)
		}
	}
}

func TestFaultsOutliveARestartButNotAReboot(t *testing.T) {
	n := newFakeNode(t)
	state := filepath.Join(t.TempDir(), "health.json")
	dev, uuid := n.gpu(3)
	func() {
		_, ctx := ktesting.NewTestContext(t)
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		m := health.New(n.lib, health.Config{StatePath: state, BootID: "boot-1", Now: n.clock.Now}, nil)
		done := make(chan struct{})
		go func() { m.Run(ctx); close(done) }()
		<-m.Watching()
		n.events <- xid(dev, 48) // reset-required: it will not repeat
		waitFor(t, m, "XID 48", count(1))
		cancel()
		<-done
	}()

	restarted, _ := n.start(t, health.Config{StatePath: state, BootID: "boot-1"})
	<-restarted.Watching()
	if f := restarted.Faults(); len(f) != 1 || f[0].GPU != uuid || f[0].Value != "48" {
		t.Fatalf("after a restart: faults %+v, want XID 48 on %s", f, uuid)
	}

	rebooted, _ := n.start(t, health.Config{StatePath: state, BootID: "boot-2"})
	<-rebooted.Watching()
	if f := rebooted.Faults(); len(f) != 0 {
		t.Fatalf("after a reboot: faults %+v, want none", f)
	}
}

func TestRestoredLostGPUThatAnswersWasReset(t *testing.T) {
	n := newFakeNode(t)
	state := filepath.Join(t.TempDir(), "health.json")
	_, uuid := n.gpu(2)
	n.setLost(uuid, true)
	first, _ := n.start(t, health.Config{StatePath: state, BootID: "b"})
	waitFor(t, first, "gpu-lost", count(1))
	n.setLost(uuid, false) // reset while no plugin ran (the first one keeps running here, but its state is saved)
	second, _ := n.start(t, health.Config{StatePath: state, BootID: "b"})
	waitFor(t, second, "the restored gpu-lost to clear at the first probe", count(0))
}

// A reset-required XID clears only when a reset is seen; an operator who
// reset the GPU without the probe noticing asks for it to be cleared.
func TestOperatorClearsAResetRequiredFault(t *testing.T) {
	n := newFakeNode(t)
	dir := filepath.Join(t.TempDir(), "health-clear")
	m, _ := n.start(t, health.Config{ClearDir: dir})
	dev, uuid := n.gpu(3)
	other, otherUUID := n.gpu(4)
	n.events <- xid(dev, 48)
	n.events <- xid(other, 48)
	waitFor(t, m, "two XIDs", count(2))
	if err := health.RequestClear(dir, uuid); err != nil {
		t.Fatal(err)
	}
	f := waitFor(t, m, "the cleared GPU's fault to go", count(1))
	if f[0].GPU != otherUUID {
		t.Fatalf("left %+v, want only the other GPU's fault", f)
	}
	if err := health.RequestClear(dir, health.ClearAll); err != nil {
		t.Fatal(err)
	}
	waitFor(t, m, "every fault to go", count(0))
	if err := health.RequestClear(dir, "../escape"); err == nil {
		t.Fatal("a clear request naming a path was accepted")
	}
}
