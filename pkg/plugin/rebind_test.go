package plugin

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/health"
	"github.com/gpuaas/gpu-dra-driver/pkg/mig"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev/nvmock"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/prepare/preparetest"
	resourceapi "k8s.io/api/resource/v1"
)

// Issue 25 item 2, what the minor left: after a re-bind the handles and
// event registrations from before may be stale (the persistent mock makes
// them so, mockhandle.go).

// watchedEnv is a test env whose driver is told of re-binds and whose
// health monitor runs, wired as Start wires them.
type watchedEnv struct {
	*testEnv
	d       *Driver
	pub     *capturePublisher
	monitor *health.Monitor

	mu       sync.Mutex
	lostSeen map[string]bool // GPUs a gpu-lost fault was ever recorded for
}

func newWatchedEnv(t *testing.T, e *testEnv, cfg *configapi.NodeConfig) *watchedEnv {
	t.Helper()
	w := &watchedEnv{testEnv: e, lostSeen: map[string]bool{}}
	w.d, w.pub = testDriver(t, e, cfg)
	w.monitor = health.New(e.Lib, health.Config{ProbeInterval: 10 * time.Millisecond}, nil)
	w.monitor.OnChange(func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		for _, f := range w.monitor.Faults() {
			if f.Kind == health.KindGPULost {
				w.lostSeen[f.GPU] = true
			}
		}
	})
	w.d.reregister = w.monitor.Reregister
	e.state.OnRebound(w.d.gpuRebound)
	ctx, cancel := context.WithCancel(e.Ctx)
	done := make(chan struct{})
	go func() { w.monitor.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	<-w.monitor.Watching()
	return w
}

func (w *watchedEnv) everLost(uuid string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.lostSeen[uuid]
}

// waitFault waits for a fault of kind on GPU index, doing poke (which may
// be nil) before each look: an event sent before the monitor registered
// again is lost, as on NVML, so it is sent again.
func (w *watchedEnv) waitFault(t *testing.T, index int, kind string, poke func()) {
	t.Helper()
	uuid := w.GPUUUID(index)
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if poke != nil {
			poke()
		}
		if slices.ContainsFunc(w.monitor.Faults(), func(f health.Fault) bool { return f.GPU == uuid && f.Kind == kind }) {
			return
		}
	}
	t.Fatalf("no %s fault on GPU %d; faults: %+v", kind, index, w.monitor.Faults())
}

func (w *watchedEnv) injectXID(t *testing.T, index int, xid uint64) func() {
	return func() {
		if err := nvmock.InjectEvent(w.MockStateDir, w.GPUUUID(index), nvml.EventTypeXidCriticalError, xid, nvmock.WholeGPU, nvmock.WholeGPU); err != nil {
			t.Fatal(err)
		}
	}
}

// migDevicesNow lists a GPU's MIG devices on a handle asked for now.
func (e *testEnv) migDevicesNow(t *testing.T, index int) []mig.Instance {
	t.Helper()
	insts, err := mig.List(e.GPUDev(t, index))
	if err != nil {
		t.Fatal(err)
	}
	return insts
}

// A MIG mode switch re-binds GPU 2. The plugin asked NVML again for the
// minor, but the handle it cached (and the health monitor's registration)
// were from before: the probe took the stale handle's GPU_IS_LOST for a
// GPU fallen off the bus, an XID on the GPU went unseen, and the unprepare
// took the GPU for lost and left the MIG device behind. Now the handle is
// asked for again and the monitor registers again.
func TestGPUReboundByAMIGModeSwitchStaysWatched(t *testing.T) {
	e := newModeEnv(t)
	w := newWatchedEnv(t, e, preparetest.DynamicAll())
	if err := nvmock.SetRebindOnMigMode(e.MockStateDir, "2", true); err != nil {
		t.Fatal(err)
	}
	if _, err := e.state.Prepare(e.Ctx, preparetest.NewClaim("m").Device("mig", e.Partition(t, 2, "2g.20gb")).Build()); err != nil {
		t.Fatal(err)
	}
	if e.minorNow(t, 2) == 2 {
		t.Fatal("the mock did not re-bind the GPU")
	}
	// Only a probe that finds the GPU answering reads its row remapping.
	if err := nvmock.SetRowRemapPending(e.MockStateDir, "2", true); err != nil {
		t.Fatal(err)
	}
	w.waitFault(t, 2, health.KindRowRemap, nil)
	w.waitFault(t, 2, health.KindXID, w.injectXID(t, 2, 48))
	if w.everLost(e.GPUUUID(2)) {
		t.Errorf("the re-bound GPU was taken for lost; faults: %+v", w.monitor.Faults())
	}
	if err := e.state.Unprepare(e.Ctx, "m"); err != nil {
		t.Fatal(err)
	}
	if left := e.migDevicesNow(t, 2); len(left) != 0 {
		t.Errorf("MIG devices left on the re-bound GPU after the unprepare: %+v", left)
	}
}

// mig-manager re-binds static-MIG GPU 0 (mocknvml rebind). The periodic
// re-read read the layout again, not the minor, and through the stale
// handle read nothing at all: the next claim's CDI spec named the old
// /dev/nvidiaN (another GPU's, or none) and the old minor stayed
// published. Now the minor is read again, published, and in the spec.
func TestStaticMIGGPUReboundFromOutsideGetsItsNewMinor(t *testing.T) {
	dir := t.TempDir()
	if _, err := nvmock.LayoutMIG(dir, "dgxh100", testNode, 0, []string{"3g.40gb", "1g.10gb"}); err != nil {
		t.Fatal(err)
	}
	cfg := &configapi.NodeConfig{GPUs: []configapi.GpuModeSelector{{Indexes: []int{0}, GpuMode: configapi.GpuMode{MIG: configapi.MigStatic}}}}
	e, w := reboundFromOutside(t, cfg, dir, 0, "1g10gb")
	w.waitFault(t, 0, health.KindXID, w.injectXID(t, 0, 48))
	if w.everLost(e.GPUUUID(0)) {
		t.Errorf("the re-bound GPU was taken for lost; faults: %+v", w.monitor.Faults())
	}
}

// A whole GPU re-bound from outside the plugin (an admin's MIG mode
// switch and back, say) kept the minor read at start: only static-MIG
// GPUs were read again, and a claim of it named the old /dev/nvidiaN.
// Every GPU's minor is now read again at the resync.
func TestWholeGPUReboundFromOutsideGetsItsNewMinor(t *testing.T) {
	reboundFromOutside(t, &configapi.NodeConfig{}, t.TempDir(), 3, "gpu-3")
}

// reboundFromOutside starts a plugin on dir's machine offering its GPUs
// as cfg says, with the resync every 20 ms, re-binds GPU index from
// outside, and checks that a device of it named like part is published
// with the new minor and a claim of it gets the new /dev/nvidiaN.
func reboundFromOutside(t *testing.T, cfg *configapi.NodeConfig, dir string, index int, part string) (*testEnv, *watchedEnv) {
	t.Helper()
	e := newTestEnvIn(t, "dgxh100", cfg, dir)
	w := newWatchedEnv(t, e, cfg)
	ctx, cancel := context.WithCancel(e.Ctx)
	t.Cleanup(cancel)
	if err := w.d.publish(ctx); err != nil {
		t.Fatal(err)
	}
	w.d.watchStaticMIG(ctx, e.Lib, cfg, 20*time.Millisecond)
	if err := nvmock.RebindGPU(dir, strconv.Itoa(index)); err != nil {
		t.Fatal(err)
	}
	minor := e.minorNow(t, index)
	if minor == index {
		t.Fatal("the mock did not re-bind the GPU")
	}
	var device string
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline) && device == ""; time.Sleep(20 * time.Millisecond) {
		device = publishedWithMinor(w.pub, e.GPUUUID(index), minor, part)
	}
	if device == "" {
		t.Fatalf("GPU %d's devices never published with its new minor %d", index, minor)
	}
	if _, err := e.state.Prepare(e.Ctx, preparetest.NewClaim("c").Device("gpu", device).Build()); err != nil {
		t.Fatal(err)
	}
	if got := gpuNodes(t, e, "c"); !slices.Equal(got, []int{minor}) {
		t.Errorf("the CDI spec names /dev/nvidia%v, want /dev/nvidia%d (the GPU's minor since its re-bind)", got, minor)
	}
	return e, w
}

// publishedWithMinor is the name of a device of the GPU whose name
// contains part, if every device of the GPU last published carries minor.
func publishedWithMinor(pub *capturePublisher, uuid string, minor int, part string) string {
	pub.mu.Lock()
	defer pub.mu.Unlock()
	if len(pub.published) == 0 {
		return ""
	}
	found := ""
	for _, s := range pub.published[len(pub.published)-1].Pools[testNode].Slices {
		for _, d := range s.Devices {
			if !slices.ContainsFunc([]string{"uuid", "parentUUID"}, func(name string) bool {
				a := d.Attributes[resourceapi.QualifiedName(name)]
				return a.StringValue != nil && *a.StringValue == uuid
			}) {
				continue
			}
			if m := d.Attributes["minor"].IntValue; m == nil || *m != int64(minor) {
				return ""
			}
			if strings.Contains(d.Name, part) {
				found = d.Name
			}
		}
	}
	return found
}
