package slicecache

import (
	"fmt"
	"runtime"
	"testing"
	"unsafe"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
	_ "github.com/gpuaas/gpu-dra-driver/pkg/nvdev/nvmock"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/inventory"
)

const (
	wholeGPUs  = "default: {}"
	dynamicMIG = "default: {mig: dynamic}"
)

// nodeSlices are the slices the plugin publishes for a simulated 8 x H100
// node under a node configuration, as the API server stores them.
func nodeSlices(tb testing.TB, node, config string) []resourceapi.ResourceSlice {
	tb.Helper()
	lib, err := nvdev.Open(nvdev.Options{Backend: "mock:dgxh100", MockSeed: node})
	if err != nil {
		tb.Fatalf("opening the simulated machine: %v", err)
	}
	defer func() { _ = lib.Shutdown() }()
	cfg, err := configapi.DecodeNodeConfig([]byte("apiVersion: gpu.gpuaas.io/v1alpha1\nkind: NodeConfig\n" + config))
	if err != nil {
		tb.Fatalf("node configuration %q: %v", config, err)
	}
	pool := inventory.Resources(node, inventory.Discover(klog.Background(), lib, cfg)).Pools[node]
	out := make([]resourceapi.ResourceSlice, 0, len(pool.Slices))
	for i, s := range pool.Slices {
		out = append(out, resourceapi.ResourceSlice{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-gpu.gpuaas.io-%d", node, i), ResourceVersion: "7",
				ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "dra-kubelet-plugin"}}},
			Spec: resourceapi.ResourceSliceSpec{Driver: "gpu.gpuaas.io", NodeName: ptr.To(node),
				Pool:    resourceapi.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: int64(len(pool.Slices))},
				Devices: s.Devices, SharedCounters: s.SharedCounters},
		})
	}
	return out
}

// decoded is s as a watch delivers it: every part allocated anew.
func decoded(tb testing.TB, s *resourceapi.ResourceSlice) *resourceapi.ResourceSlice {
	tb.Helper()
	data, err := s.Marshal()
	if err != nil {
		tb.Fatal(err)
	}
	var out resourceapi.ResourceSlice
	if err := out.Unmarshal(data); err != nil {
		tb.Fatal(err)
	}
	return &out
}

func transformed(tb testing.TB, s *resourceapi.ResourceSlice) *resourceapi.ResourceSlice {
	tb.Helper()
	obj, err := Transform(s)
	if err != nil {
		tb.Fatalf("transform: %v", err)
	}
	return obj.(*resourceapi.ResourceSlice)
}

// Pricing, posture and the GpuNodes read every field a selector or a
// placement may name: the transform must keep all of them.
func TestTransformKeepsEverythingButManagedFields(t *testing.T) {
	for _, config := range []string{wholeGPUs, dynamicMIG, "default: {shared: {memory: {min: 1Gi, step: 1Gi, default: 1Gi}}}"} {
		for _, s := range nodeSlices(t, "node-a", config) {
			want := s.DeepCopy()
			want.ManagedFields = nil
			got := transformed(t, decoded(t, &s))
			if !equality.Semantic.DeepEqual(got, want) {
				t.Fatalf("%s: slice %s changed by the transform:\ngot  %+v\nwant %+v", config, s.Name, got.Spec, want.Spec)
			}
		}
	}
}

// Every kind of attribute value survives, lists included.
func TestTransformKeepsEveryAttributeKind(t *testing.T) {
	s := &resourceapi.ResourceSlice{Spec: resourceapi.ResourceSliceSpec{Driver: "gpu.example.com", Devices: []resourceapi.Device{{
		Name: "d0",
		Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			"int": {IntValue: ptr.To[int64](3)}, "bool": {BoolValue: ptr.To(true)}, "off": {BoolValue: ptr.To(false)},
			"string": {StringValue: ptr.To("x")}, "version": {VersionValue: ptr.To("1.2.3")},
			"ints": {IntValues: []int64{1, 2}}, "strings": {StringValues: []string{"a", "b"}},
		},
		Capacity:                 map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{"memory": {Value: resource.MustParse("1Gi")}},
		AllowMultipleAllocations: ptr.To(true),
		Taints:                   []resourceapi.DeviceTaint{{Key: "k", Effect: resourceapi.DeviceTaintEffectNoSchedule}},
	}}}}
	want := s.DeepCopy()
	if got := transformed(t, decoded(t, s)); !equality.Semantic.DeepEqual(got, want) {
		t.Fatalf("got %+v, want %+v", got.Spec.Devices, want.Spec.Devices)
	}
}

// What is the same on two nodes is held once: a GPU's capacity, the
// counters a MIG placement consumes, the counter sets, attribute names.
func TestTwoNodesShareWhatIsTheSame(t *testing.T) {
	a, b := nodeSlices(t, "node-a", dynamicMIG), nodeSlices(t, "node-b", dynamicMIG)
	if len(a) != len(b) {
		t.Fatalf("node-a publishes %d slices, node-b %d", len(a), len(b))
	}
	var devices, counters int
	for i := range a {
		sa, sb := transformed(t, decoded(t, &a[i])), transformed(t, decoded(t, &b[i]))
		for j := range sa.Spec.SharedCounters {
			counters++
			if !sameMap(sa.Spec.SharedCounters[j].Counters, sb.Spec.SharedCounters[j].Counters) {
				t.Errorf("counter set %s: two copies", sa.Spec.SharedCounters[j].Name)
			}
		}
		for j := range sa.Spec.Devices {
			devices++
			da, db := &sa.Spec.Devices[j], &sb.Spec.Devices[j]
			if !sameMap(da.Capacity, db.Capacity) {
				t.Errorf("device %s: two copies of its capacity", da.Name)
			}
			if len(da.ConsumesCounters) > 0 && &da.ConsumesCounters[0] != &db.ConsumesCounters[0] {
				t.Errorf("device %s: two copies of the counters it consumes", da.Name)
			}
			if *da.Attributes["productName"].StringValue != *db.Attributes["productName"].StringValue ||
				unsafeData(*da.Attributes["productName"].StringValue) != unsafeData(*db.Attributes["productName"].StringValue) {
				t.Errorf("device %s: two copies of its product name", da.Name)
			}
			if sameMap(da.Attributes, db.Attributes) {
				t.Errorf("device %s: node-b's attributes (its GPU's UUID among them) are node-a's", da.Name)
			}
		}
	}
	if devices == 0 || counters == 0 {
		t.Fatalf("compared %d devices and %d counter sets: the fixture publishes neither", devices, counters)
	}
}

// What node-a's slice shares, node-b's shares still after a garbage
// collection between the two: the cache holds node-a's slice for hours,
// and collections run all the while. (Interning through the standard
// library's unique package, as at first, kept a string only while its
// Handle lived: this failed, as CI's run of the test above did.)
func TestSharingOutlivesAGarbageCollection(t *testing.T) {
	a := transformed(t, decoded(t, firstWithDevices(t, "node-a")))
	runtime.GC()
	runtime.GC()
	b := transformed(t, decoded(t, firstWithDevices(t, "node-b")))
	da, db := &a.Spec.Devices[0], &b.Spec.Devices[0]
	for _, s := range []struct{ what, a, b string }{
		{"device name", da.Name, db.Name},
		{"product name", *da.Attributes["productName"].StringValue, *db.Attributes["productName"].StringValue},
		{"driver", a.Spec.Driver, b.Spec.Driver},
	} {
		if s.a != s.b || unsafeData(s.a) != unsafeData(s.b) {
			t.Errorf("%s: two copies after a garbage collection", s.what)
		}
	}
	if !sameMap(da.Capacity, db.Capacity) {
		t.Error("capacity: two copies after a garbage collection")
	}
	runtime.KeepAlive(a)
}

func firstWithDevices(tb testing.TB, node string) *resourceapi.ResourceSlice {
	tb.Helper()
	for _, s := range nodeSlices(tb, node, wholeGPUs) {
		if len(s.Spec.Devices) > 0 {
			return &s
		}
	}
	tb.Fatalf("%s publishes no devices", node)
	return nil
}

// A table at its bound starts over: nothing is lost, later parts share
// among themselves.
func TestAFullTableStartsOver(t *testing.T) {
	tb := newTable[any](2)
	one, two, three := ptr.To(1), ptr.To(2), ptr.To(3)
	tb.share("1", one)
	tb.share("2", two)
	if got := tb.share("3", three); got != three {
		t.Fatalf("a new part came back as %v", got)
	}
	if tb.len() != 1 {
		t.Fatalf("the full table holds %d parts after a new one, want 1 (cleared first)", tb.len())
	}
	if got := tb.share("3", ptr.To(3)); got != three {
		t.Fatal("a part held after the table started over is not shared")
	}
}

// Objects that are not slices (tombstones) pass unchanged but for their
// managedFields.
func TestTransformPassesOtherObjects(t *testing.T) {
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "m"}}}}
	got, err := Transform(c)
	if err != nil || got.(*resourceapi.ResourceClaim).Name != "c" || got.(*resourceapi.ResourceClaim).ManagedFields != nil {
		t.Fatalf("Transform(claim) = %v, %v", got, err)
	}
}

func sameMap[K comparable, V any](a, b map[K]V) bool {
	return fmt.Sprintf("%p", a) == fmt.Sprintf("%p", b)
}

// BenchmarkCachedSliceHeap (issue 52): the live heap a cache holds per
// slice of ours, as decoded from the watch and after Transform, for a
// fleet of 8 x H100 nodes of whole GPUs and of dynamic MIG. Reported as
// B/slice (heap after GC, divided by the slices held).
func BenchmarkCachedSliceHeap(b *testing.B) {
	const nodes = 200
	for _, config := range []struct{ name, body string }{{"whole", wholeGPUs}, {"dynamic-mig", dynamicMIG}} {
		var wire []*resourceapi.ResourceSlice
		for i := range nodes {
			for _, s := range nodeSlices(b, fmt.Sprintf("node-%d", i), config.body) {
				wire = append(wire, &s)
			}
		}
		for _, transform := range []bool{false, true} {
			b.Run(fmt.Sprintf("%s/transform=%v", config.name, transform), func(b *testing.B) {
				for range b.N {
					before := liveHeap()
					held := make([]*resourceapi.ResourceSlice, 0, len(wire))
					for _, s := range wire {
						d := decoded(b, s)
						if transform {
							d = transformed(b, d)
						}
						held = append(held, d)
					}
					b.ReportMetric(float64(liveHeap()-before)/float64(len(held)), "B/slice")
					runtime.KeepAlive(held)
				}
			})
		}
	}
}

func liveHeap() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

func unsafeData(s string) *byte { return unsafe.StringData(s) }
