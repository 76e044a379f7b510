package health_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/gpuaas/gpu-dra-driver/pkg/health"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev/nvmock"
	"k8s.io/klog/v2/ktesting"
)

// persistentNode is a persistent mock machine, whose GPUs mocknvml's
// functions re-bind, lose and send XIDs from outside, and a monitor of it.
type persistentNode struct {
	dir string
	lib nvdev.Interface
	m   *health.Monitor

	mu sync.Mutex
	// lostSeen are the GPUs a gpu-lost fault was ever recorded for.
	lostSeen map[string]bool
}

func startPersistent(t *testing.T) *persistentNode {
	t.Helper()
	n := &persistentNode{dir: t.TempDir(), lostSeen: map[string]bool{}}
	lib, err := nvdev.Open(nvdev.Options{Backend: "mock:dgxh100", MockSeed: "node-a", MockStateDir: n.dir})
	if err != nil {
		t.Fatal(err)
	}
	n.lib = lib
	n.m = health.New(lib, health.Config{ProbeInterval: 10 * time.Millisecond}, nil)
	n.m.OnChange(func() {
		n.mu.Lock()
		defer n.mu.Unlock()
		for _, f := range n.m.Faults() {
			if f.Kind == health.KindGPULost {
				n.lostSeen[f.GPU] = true
			}
		}
	})
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { n.m.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done; _ = lib.Shutdown() })
	<-n.m.Watching()
	return n
}

func (n *persistentNode) uuid(i int) string { return n.lib.GPUs()[i].UUID }

func (n *persistentNode) everLost(uuid string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.lostSeen[uuid]
}

// xidSeen sends XID 48 on GPU i until the monitor records it: one sent
// before a re-registration is lost, as on NVML, so it is sent again.
func (n *persistentNode) xidSeen(t *testing.T, i int) {
	t.Helper()
	uuid := n.uuid(i)
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if err := nvmock.InjectEvent(n.dir, uuid, nvml.EventTypeXidCriticalError, 48, nvmock.WholeGPU, nvmock.WholeGPU); err != nil {
			t.Fatal(err)
		}
		for _, f := range n.m.Faults() {
			if f.GPU == uuid && f.Kind == health.KindXID && f.Value == "48" {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("XID 48 on GPU %d never seen; faults: %+v", i, n.m.Faults())
}

// A GPU re-bound behind the monitor's back (mig-manager) answers only on
// a handle asked for again, and no longer delivers XIDs to the old
// registration. The probe used to take its stale handle for a GPU fallen
// off the bus (tainting it lost) and its XIDs went unseen; now the probe
// asks again, finds it answering, and registers it again.
func TestReboundGPUIsNotLostAndItsXIDsAreSeen(t *testing.T) {
	n := startPersistent(t)
	if err := nvmock.RebindGPU(n.dir, "2"); err != nil {
		t.Fatal(err)
	}
	n.xidSeen(t, 2)
	if n.everLost(n.uuid(2)) {
		t.Errorf("the re-bound GPU was taken for lost; faults: %+v", n.m.Faults())
	}
	n.xidSeen(t, 3) // the others are still watched
}

// When the plugin knows of a re-bind it forgets the handle itself, so the
// probe finds nothing stale: Reregister makes the GPU's XIDs seen.
func TestReregisterAfterARebind(t *testing.T) {
	n := startPersistent(t)
	if err := nvmock.RebindGPU(n.dir, "5"); err != nil {
		t.Fatal(err)
	}
	n.lib.ForgetHandle(n.uuid(5))
	n.m.Reregister()
	n.xidSeen(t, 5)
	if n.everLost(n.uuid(5)) {
		t.Errorf("the re-bound GPU was taken for lost; faults: %+v", n.m.Faults())
	}
}

// A GPU that is re-bound and then falls off the bus is still found lost:
// asking for its handle again fails too.
func TestLostGPUIsLostAfterARebind(t *testing.T) {
	n := startPersistent(t)
	if err := nvmock.RebindGPU(n.dir, "4"); err != nil {
		t.Fatal(err)
	}
	if err := nvmock.SetGPULost(n.dir, "4", true); err != nil {
		t.Fatal(err)
	}
	waitFor(t, n.m, "the lost GPU's fault", func(faults []health.Fault) bool {
		for _, f := range faults {
			if f.GPU == n.uuid(4) && f.Kind == health.KindGPULost {
				return true
			}
		}
		return false
	})
}
