package plugin

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/device"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/inventory"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/telemetry"

	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/mig"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/prepare/preparetest"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"
)

// capturePublisher keeps what the driver publishes, in place of the
// kubelet plugin helper.
type capturePublisher struct {
	mu        sync.Mutex
	published []resourceslice.DriverResources
}

func (c *capturePublisher) PublishResources(_ context.Context, r resourceslice.DriverResources) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.published = append(c.published, r)
	return nil
}

func (c *capturePublisher) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.published)
}

func (c *capturePublisher) last(t *testing.T) resourceslice.Pool {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.published) == 0 {
		t.Fatal("nothing published")
	}
	return c.published[len(c.published)-1].Pools[testNode]
}

// dynamicFirstFour: GPUs 0-3 in dynamic MIG, the others whole.
func dynamicFirstFour() *configapi.NodeConfig {
	return &configapi.NodeConfig{GPUs: []configapi.GpuModeSelector{
		{Indexes: []int{0, 1, 2, 3}, GpuMode: configapi.GpuMode{MIG: configapi.MigDynamic}},
	}}
}

// testDriver is a Driver over the env's state that publishes into a
// capturePublisher, as Start wires it with the helper.
func testDriver(t *testing.T, e *testEnv, cfg *configapi.NodeConfig) (*Driver, *capturePublisher) {
	pub := &capturePublisher{}
	e.Metrics = telemetry.NewMetrics(prometheus.NewRegistry())
	inv := inventory.Discover(ktesting.NewLogger(t, ktesting.NewConfig()), e.Lib, cfg)
	return &Driver{state: e.state, nodeName: testNode, metrics: e.Metrics, inv: inv, pub: pub,
		events: telemetry.NewNodeEvents(context.Background(), e.Events, nil, testNode)}, pub
}

// storedWithout is the error the slice controller reports when the API
// server stored slice i of pool without what drop removes from it.
func storedWithout(pool resourceslice.Pool, i int, drop func(*resourceapi.ResourceSliceSpec)) error {
	s := pool.Slices[i]
	desired := &resourceapi.ResourceSlice{Spec: resourceapi.ResourceSliceSpec{SharedCounters: s.SharedCounters, Devices: s.Devices}}
	actual := desired.DeepCopy()
	drop(&actual.Spec)
	// Wrapped, as the kubelet plugin helper hands it on.
	return fmt.Errorf("create ResourceSlice: %w", &resourceslice.DroppedFieldsError{
		PoolName: testNode, SliceIndex: i, DesiredSlice: desired, ActualSlice: actual})
}

func dropCounters(spec *resourceapi.ResourceSliceSpec) {
	spec.SharedCounters = nil
	for i := range spec.Devices {
		spec.Devices[i].ConsumesCounters = nil
	}
}

func usesCounters(pool resourceslice.Pool) bool {
	for _, s := range pool.Slices {
		if len(s.SharedCounters) > 0 {
			return true
		}
		for _, d := range s.Devices {
			if len(d.ConsumesCounters) > 0 {
				return true
			}
		}
	}
	return false
}

// Item 11: the API server drops the counters (partitionable devices off);
// the next publish offers no dynamic-MIG device and nothing that uses
// counters, keeps the whole GPUs (which consumed GPU milliunits) without
// counters, and says so in a gauge.
func TestDroppedCountersWithdrawDynamicMIG(t *testing.T) {
	e := newTestEnvWith(t, "dgxh100", dynamicFirstFour())
	d, pub := testDriver(t, e, dynamicFirstFour())
	if err := d.publish(e.Ctx); err != nil {
		t.Fatal(err)
	}
	first := pub.last(t)
	if !usesCounters(first) {
		t.Fatal("the first publish uses no counters; nothing to test")
	}
	if n := unitCounted(first); n != 4 {
		t.Fatalf("%d whole GPUs consume GPU milliunits, want GPUs 4-7", n)
	}
	// Every slice of the first publish comes back without its counters.
	for i := range first.Slices {
		d.HandleError(e.Ctx, storedWithout(first, i, dropCounters), "create ResourceSlice")
	}
	if n := pub.count(); n != 2 {
		t.Fatalf("%d publishes, want the first and one without dynamic MIG", n)
	}
	if got := e.Events.WithReason(telemetry.ReasonDynamicMIGWithdrawn); len(got) != 1 || !strings.Contains(got[0], "no longer offering dynamic MIG on 4 GPU(s)") {
		t.Errorf("Node events %q, want one saying why dynamic MIG is withdrawn", got)
	}
	after := pub.last(t)
	if usesCounters(after) {
		t.Error("republished slices still use counters")
	}
	names := map[string]bool{}
	for _, s := range after.Slices {
		for _, dev := range s.Devices {
			names[dev.Name] = true
			if *dev.Attributes["type"].StringValue == string(device.TypeMIG) {
				t.Errorf("dynamic MIG device %s still offered", dev.Name)
			}
			if i := strings.TrimPrefix(dev.Name, "gpu-"); len(i) == 1 && i < "4" {
				t.Errorf("dynamic-MIG GPU offered as %s", dev.Name)
			}
		}
	}
	for i := 4; i < 8; i++ {
		if !names[device.GPUDeviceName(i)] {
			t.Errorf("whole GPU %d no longer offered", i)
		}
	}
	if got := testutil.ToFloat64(e.Metrics.WithdrawnMIG); got != 4 {
		t.Errorf("dynamic_mig_withdrawn_gpus = %v, want 4", got)
	}
	if got := testutil.ToFloat64(e.Metrics.PublishedDevices.WithLabelValues(string(device.TypeMIG))); got != 0 {
		t.Errorf("published_devices{type=mig} = %v, want 0", got)
	}
}

// Fields other than counters dropped (here device taints) leave dynamic
// MIG offered: only counters keep its devices apart.
func TestOtherDroppedFieldsKeepDynamicMIG(t *testing.T) {
	e := newTestEnvWith(t, "dgxh100", dynamicFirstFour())
	d, pub := testDriver(t, e, dynamicFirstFour())
	if err := d.publish(e.Ctx); err != nil {
		t.Fatal(err)
	}
	first := pub.last(t)
	first.Slices[1].Devices[0].Taints = []resourceapi.DeviceTaint{{Key: "gpu.gpuaas.io/xid", Effect: resourceapi.DeviceTaintEffectNoSchedule}}
	d.HandleError(e.Ctx, storedWithout(first, 1, func(s *resourceapi.ResourceSliceSpec) { s.Devices[0].Taints = nil }), "update ResourceSlice")
	if n := pub.count(); n != 1 || testutil.ToFloat64(e.Metrics.WithdrawnMIG) != 0 {
		t.Errorf("%d publishes, gauge %v: dynamic MIG withdrawn for dropped taints", n, testutil.ToFloat64(e.Metrics.WithdrawnMIG))
	}
}

// unitCounted is how many devices consume nothing but GPU milliunits.
func unitCounted(pool resourceslice.Pool) int {
	n := 0
	for _, s := range pool.Slices {
		for _, d := range s.Devices {
			if len(d.ConsumesCounters) > 0 && mig.WithoutMilliunits(d.ConsumesCounters) == nil {
				n++
			}
		}
	}
	return n
}

func publishedNames(pool resourceslice.Pool) []string {
	var out []string
	for _, s := range pool.Slices {
		for _, d := range s.Devices {
			out = append(out, d.Name)
		}
	}
	slices.Sort(out)
	return out
}

// Dropped counters take GPU milliunits off whole GPUs, replicas and static
// MIG but keep offering them, as before unit counters: only the dynamic
// MIG GPU is withdrawn, and the unit-only counter sets go.
func TestDroppedCountersKeepUnitCountedDevices(t *testing.T) {
	e, cfg := unitModes(t, nil)
	d, pub := testDriver(t, e, cfg)
	if err := d.publish(e.Ctx); err != nil {
		t.Fatal(err)
	}
	first := pub.last(t)
	for i := range first.Slices {
		d.HandleError(e.Ctx, storedWithout(first, i, dropCounters), "create ResourceSlice")
	}
	if n := pub.count(); n != 2 {
		t.Fatalf("%d publishes, want the first and one without counters", n)
	}
	after := pub.last(t)
	if usesCounters(after) {
		t.Error("republished slices still use counters")
	}
	var want []string
	for _, s := range first.Slices {
		for _, dev := range s.Devices {
			if !strings.HasPrefix(dev.Name, "gpu-0-") && dev.Name != device.GPUDeviceName(0) {
				want = append(want, dev.Name)
			}
		}
	}
	slices.Sort(want)
	if got := publishedNames(after); !slices.Equal(got, want) {
		t.Errorf("republished %v\nwant everything but dynamic GPU 0's: %v", got, want)
	}
	if got := testutil.ToFloat64(e.Metrics.WithdrawnMIG); got != 1 {
		t.Errorf("dynamic_mig_withdrawn_gpus = %v, want 1", got)
	}
}

// With no dynamic MIG at all, dropped counters republish every GPU whole,
// without its milliunits, and withdraw nothing.
func TestDroppedCountersWholeGPUsOnly(t *testing.T) {
	e := newTestEnv(t, "dgxh100")
	d, pub := testDriver(t, e, &configapi.NodeConfig{})
	if err := d.publish(e.Ctx); err != nil {
		t.Fatal(err)
	}
	first := pub.last(t)
	if n := unitCounted(first); n != 8 {
		t.Fatalf("%d whole GPUs consume GPU milliunits, want 8", n)
	}
	for i := range first.Slices {
		d.HandleError(e.Ctx, storedWithout(first, i, dropCounters), "create ResourceSlice")
	}
	after := pub.last(t)
	if n := pub.count(); n != 2 || usesCounters(after) || !slices.Equal(publishedNames(after), publishedNames(first)) {
		t.Errorf("%d publishes, last %v (counters: %v); want the 8 whole GPUs again without counters", n, publishedNames(after), usesCounters(after))
	}
	if got := testutil.ToFloat64(e.Metrics.WithdrawnMIG); got != 0 {
		t.Errorf("dynamic_mig_withdrawn_gpus = %v, want 0", got)
	}
}

// Unit counters off and no dynamic MIG: nothing of ours uses counters, so
// a report that counters were dropped republishes nothing.
func TestDroppedFieldsWithoutCountersRepublishNothing(t *testing.T) {
	e := newTestEnv(t, "dgxh100")
	d, pub := testDriver(t, e, &configapi.NodeConfig{GPUUnitCounters: ptr.To(false)})
	if err := d.publish(e.Ctx); err != nil {
		t.Fatal(err)
	}
	first := pub.last(t)
	if usesCounters(first) {
		t.Fatal("unit counters off, yet the publish uses counters")
	}
	d.withdrawDynamicMIG(e.Ctx, &resourceslice.DroppedFieldsError{PoolName: testNode})
	if n := pub.count(); n != 1 || d.withdrawn {
		t.Errorf("%d publishes (withdrawn: %v), want only the first", n, d.withdrawn)
	}
}

// The scheduler's first fit over what the plugin publishes gives a 3g.40gb
// claim the upper half of a GPU that has it free before the lower half of
// any GPU (issue 29): the lower half is the only place of 4g.40gb, and a
// GPU holding 3g + 4g is full, where 3g + 3g strands a compute slice. Only
// when every upper half is taken does a lower half go.
func TestFirstFitTakesUpperHalvesBeforeLowerHalves(t *testing.T) {
	e := newTestEnv(t, "dgxh100")
	published := preparetest.APISlices(inventory.Resources(testNode, inventory.Discover(ktesting.NewLogger(t, ktesting.NewConfig()), e.Lib, preparetest.DynamicAll())))
	classes := preparetest.ClassLister{"mig-3g": preparetest.CELClass("mig-3g", `device.driver == "gpu.gpuaas.io" && device.attributes["gpu.gpuaas.io"].type == "mig" && `+
		`device.attributes["gpu.gpuaas.io"].profile == "3g.40gb"`)}
	forScheduler := preparetest.ForScheduler(t, published)
	allocated := sets.New[structured.DeviceID]()
	take := func(name string) {
		allocated.Insert(structured.MakeDeviceID(configapi.DriverName, testNode, name))
	}
	next := func() string {
		t.Helper()
		alloc, err := structured.NewAllocator(t.Context(), preparetest.SchedulerFeatures, structured.AllocatedState{AllocatedDevices: allocated},
			classes, forScheduler, cel.NewCache(10, cel.Features{EnableConsumableCapacity: true}))
		if err != nil {
			t.Fatal(err)
		}
		res, err := alloc.Allocate(t.Context(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: testNode}}, []*resourceapi.ResourceClaim{preparetest.OneDeviceClaim("mig-3g")})
		if err != nil || len(res) != 1 {
			t.Fatalf("allocating: %v (%d results)", err, len(res))
		}
		return res[0].Devices.Results[0].Device
	}
	for gpu := range 8 {
		want := fmt.Sprintf("gpu-%d-mig-3g40gb-4", gpu)
		if got := next(); got != want {
			t.Fatalf("with the upper halves of GPUs 0-%d taken, a 3g.40gb claim got %s, want %s", gpu-1, got, want)
		}
		take(want)
	}
	if got := next(); got != "gpu-0-mig-3g40gb-0" {
		t.Errorf("with every upper half taken, a 3g.40gb claim got %s, want gpu-0-mig-3g40gb-0", got)
	}
}

// Deferring keeps the slices' grouping: each dynamic MIG GPU's other
// devices stay together in their slice, the deferred ones follow every
// other device in slices of their own, and the inventory keeps every
// device once.
func TestDeferPlacementsKeepsGroups(t *testing.T) {
	e := newTestEnv(t, "dgxh100")
	cfg := &configapi.NodeConfig{Default: configapi.GpuMode{MIG: configapi.MigDynamic},
		GPUs: []configapi.GpuModeSelector{{Indexes: []int{2}}}} // GPU 2 whole, between dynamic ones
	inv := inventory.Discover(ktesting.NewLogger(t, ktesting.NewConfig()), e.Lib, cfg)
	names := map[string]int{}
	for _, d := range inv.Devices {
		names[d.Name()]++
	}
	// A dynamic MIG H100 is 26 devices: its 25 (profile, placement) pairs
	// and the whole GPU.
	if len(names) != len(inv.Devices) || len(inv.Devices) != 7*26+1 {
		t.Fatalf("%d devices, %d distinct, want %d", len(inv.Devices), len(names), 7*26+1)
	}
	pool := inventory.Resources(testNode, inv).Pools[testNode]
	var tail []string
	for i, s := range pool.Slices[1:] {
		gpus := map[int]bool{}
		for _, d := range s.Devices {
			var gpu int
			if _, err := fmt.Sscanf(d.Name, "gpu-%d", &gpu); err != nil {
				t.Fatal(err)
			}
			gpus[gpu] = true
		}
		if i == len(pool.Slices)-2 {
			for _, d := range s.Devices {
				tail = append(tail, d.Name)
			}
			continue
		}
		if len(gpus) != 1 {
			t.Errorf("slice %d mixes GPUs %v", i+1, gpus)
		}
		for _, d := range s.Devices {
			if strings.HasSuffix(d.Name, "-mig-3g40gb-0") {
				t.Errorf("slice %d lists deferred %s among its GPU's devices", i+1, d.Name)
			}
		}
	}
	want := []string{"gpu-0-mig-3g40gb-0", "gpu-1-mig-3g40gb-0", "gpu-3-mig-3g40gb-0", "gpu-4-mig-3g40gb-0",
		"gpu-5-mig-3g40gb-0", "gpu-6-mig-3g40gb-0", "gpu-7-mig-3g40gb-0"}
	if !slices.Equal(tail, want) {
		t.Errorf("last slice %v, want %v", tail, want)
	}
}
