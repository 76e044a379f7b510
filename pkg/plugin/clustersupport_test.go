package plugin

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpuaas/gpu-dra-driver/pkg/sliceprobe"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/version"
	fakediscovery "k8s.io/client-go/discovery/fake"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// apiServer answers the probe's dry-run creates as an API server whose
// partitionable devices are on or off (dropping the counters), or not at
// all (down).
type apiServer struct {
	countersOff, down atomic.Bool
}

func (a *apiServer) client() *fake.Clientset {
	c := fake.NewClientset()
	c.PrependReactor("create", "resourceslices", func(act k8stesting.Action) (bool, runtime.Object, error) {
		if a.down.Load() {
			return true, nil, errors.New("connection refused")
		}
		s := act.(k8stesting.CreateActionImpl).Object.(*resourceapi.ResourceSlice).DeepCopy()
		if a.countersOff.Load() {
			s.Spec.SharedCounters = nil
			for i := range s.Spec.Devices {
				s.Spec.Devices[i].ConsumesCounters = nil
			}
		}
		return true, s, nil
	})
	return c
}

// Issue 35: the cluster's answer is asked again, and a different one
// republishes in the new shape: partitionable devices turned off (an API
// server downgraded or its gate unset) withdraw dynamic MIG without a
// restart of the plugin, and turned on again bring it back.
func TestClusterSupportChangeRepublishes(t *testing.T) {
	// Made first, so removed last: the watch below writes its answers
	// there until its context ends (it leaked its writes past the test).
	dataDir := t.TempDir()
	e := newTestEnv(t, "dgxh100")
	d, pub := testDriver(t, e, dynamicFirstFour())
	api := &apiServer{}
	probe := newClusterProbe(Options{KubeClient: api.client(), NodeName: testNode, PluginDataDir: dataDir, ClusterProbeInterval: 10 * time.Millisecond})
	d.learnClusterSupport(e.Ctx, probe)
	if err := d.publish(e.Ctx); err != nil {
		t.Fatal(err)
	}
	if !usesCounters(pub.last(t)) {
		t.Fatal("counters not published on a cluster that keeps them")
	}
	ctx, stop := context.WithCancel(e.Ctx)
	t.Cleanup(stop)
	d.watchClusterSupport(ctx, probe)
	api.countersOff.Store(true)
	waitPublished(t, pub, func() bool { return !usesCounters(pub.last(t)) }, "dynamic MIG withdrawn after the cluster dropped counters")
	api.countersOff.Store(false)
	waitPublished(t, pub, func() bool { return usesCounters(pub.last(t)) }, "dynamic MIG back after the cluster kept counters again")
}

// A start that cannot ask publishes what the last answer allowed, and with
// no answer ever, the least any supported version keeps: nothing the
// scheduler could hand out twice.
func TestClusterSupportFailsClosed(t *testing.T) {
	e := newTestEnv(t, "dgxh100")
	dir := t.TempDir()
	api := &apiServer{}
	api.down.Store(true)
	probe := newClusterProbe(Options{KubeClient: api.client(), NodeName: testNode, PluginDataDir: dir})
	if got := probe.ask(e.Ctx); got != sliceprobe.Least {
		t.Errorf("no answer ever: assumed %+v, want Least", got)
	}
	api.down.Store(false)
	answered := probe.ask(e.Ctx)
	if answered.Counters != sliceprobe.CountersInOwnSlices {
		t.Fatalf("answered %+v", answered)
	}
	api.down.Store(true)
	restarted := newClusterProbe(Options{KubeClient: api.client(), NodeName: testNode, PluginDataDir: dir})
	if got := restarted.ask(e.Ctx); got != answered {
		t.Errorf("a restart that cannot ask assumed %+v, want the last answer %+v", got, answered)
	}
}

// Issue 57: where the dry-run creates fail but discovery answers, a 1.38
// API server is known to keep counters and taints (their gates are locked
// on): dynamic MIG is published without an answer, consumable capacity
// (which 1.38 can still turn off) is not assumed.
func TestClusterSupportFailsClosedToWhat138CannotDrop(t *testing.T) {
	e := newTestEnv(t, "dgxh100")
	api := &apiServer{}
	api.down.Store(true)
	client := api.client()
	client.Discovery().(*fakediscovery.FakeDiscovery).FakedServerVersion = &version.Info{GitVersion: "v1.38.0"}
	probe := newClusterProbe(Options{KubeClient: client, NodeName: testNode, PluginDataDir: t.TempDir()})
	got := probe.ask(e.Ctx)
	if got.Counters != sliceprobe.CountersInOwnSlices || !got.Taints || got.ConsumableCapacity {
		t.Errorf("1.38, not answering: assumed %+v, want counters and taints kept, consumable capacity not", got)
	}
}

func waitPublished(t *testing.T, pub *capturePublisher, cond func() bool, what string) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(t.Context(), 10*time.Millisecond, 30*time.Second, true,
		func(ctx context.Context) (bool, error) { return cond(), nil }); err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}
