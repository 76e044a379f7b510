package validatenext

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	draapi "k8s.io/dynamic-resource-allocation/api"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/kubernetes/pkg/features"
	"k8s.io/utils/ptr"
)

// The demo node's slices (demo/node-config.yaml on the simulated 8 x H100):
// GPUs 0-3 whole, GPU 4 time-sliced, GPU 5 shared (one device many claims
// hold, each consuming memory), GPUs 6 and 7 dynamic MIG (every profile at
// every placement and the whole GPU, all consuming the GPU's counters).
const demoNode = "dgxh100-demo-healthy"

// The classes claims allocate from, as the catalog's are: by the driver
// and the type attribute the plugin publishes.
var allocClasses = classLister{
	"whole":  class(`device.attributes["gpu.gpuaas.io"].type == "gpu"`),
	"mig-1g": class(`device.attributes["gpu.gpuaas.io"].type == "mig" && device.attributes["gpu.gpuaas.io"].profile == "1g.10gb"`),
	"mig-7g": class(`device.attributes["gpu.gpuaas.io"].type == "mig" && device.attributes["gpu.gpuaas.io"].profile == "7g.80gb"`),
	"shared": class(`device.attributes["gpu.gpuaas.io"].type == "shared"`),
}

// TestAllocatorWholeGPUs: 1.38's allocator hands out each whole GPU the
// node offers once (GPUs 0-3 and the whole-GPU devices of the dynamic MIG
// GPUs 6 and 7), and then nothing more; with both MIG GPUs taken whole, no
// MIG device is left (their counters are spent).
func TestAllocatorWholeGPUs(t *testing.T) {
	s := newAllocScheduler(t, demoSlices(t))
	var got []string
	for i := range 10 {
		if d := s.allocate(fmt.Sprintf("whole-%d", i), exactly("whole", nil)); d != "" {
			got = append(got, d)
		}
	}
	slices.Sort(got)
	want := []string{"gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-6", "gpu-7"}
	if !slices.Equal(got, want) {
		t.Fatalf("whole GPUs allocated: %v, want each of %v once", got, want)
	}
	if d := s.allocate("mig-after-whole", exactly("mig-1g", nil)); d != "" {
		t.Errorf("a MIG device (%s) was allocated with both MIG GPUs taken whole", d)
	}
}

// TestAllocatorDynamicMIG: the partitionable counters hold under 1.38's
// allocator: seven 1g.10gb devices fit on each of the two dynamic MIG GPUs
// and not an eighth, a 7g.80gb takes a GPU alone, and a GPU with a MIG
// device taken is not given out whole.
func TestAllocatorDynamicMIG(t *testing.T) {
	s := newAllocScheduler(t, demoSlices(t))
	if d := s.allocate("mig-7g", exactly("mig-7g", nil)); d == "" {
		t.Fatal("no 7g.80gb on an idle node")
	}
	n := 0
	for i := range 10 {
		if s.allocate(fmt.Sprintf("mig-1g-%d", i), exactly("mig-1g", nil)) != "" {
			n++
		}
	}
	if n != 7 {
		t.Errorf("1g.10gb devices allocated beside a 7g.80gb: %d, want 7 (one GPU's worth)", n)
	}
	for i := range 4 {
		if d := s.allocate(fmt.Sprintf("whole-%d", i), exactly("whole", nil)); d == "gpu-6" || d == "gpu-7" {
			t.Errorf("%s was allocated whole with MIG devices on it", d)
		}
	}
}

// TestAllocatorShares: the shared GPU's memory is consumable capacity:
// shares of 10Gi are allocated (each its own share ID, consuming 10Gi)
// until the GPU's memory is spent, counting the shares allocated before
// (the scheduler's allocated state), and not one more.
func TestAllocatorShares(t *testing.T) {
	in := demoSlices(t)
	capacity := device(t, in, "gpu-5-shared").Capacity["memory"].Value
	share := resource.MustParse("10Gi")
	want := int(capacity.Value() / share.Value())
	s := newAllocScheduler(t, in)
	n := 0
	for i := range want + 2 {
		if d := s.allocate(fmt.Sprintf("share-%d", i), exactly("shared", &share)); d != "" {
			if d != "gpu-5-shared" {
				t.Fatalf("a share was allocated on %s", d)
			}
			n++
		}
	}
	if n != want {
		t.Errorf("%s shares allocated on a GPU of %s: %d, want %d", share.String(), capacity.String(), n, want)
	}
	for _, c := range s.claims {
		r := c.Devices.Results[0]
		if got := r.ConsumedCapacity["memory"]; r.ShareID == nil || got.Cmp(share) != 0 {
			t.Errorf("share %s: share ID %v, consumed %v, want a share ID and memory %s", r.Device, r.ShareID, r.ConsumedCapacity, share.String())
		}
	}
}

// TestAllocatorNoExclusiveWhileShared: the rule 1.38 adds. A device that
// is no longer published as allowMultipleAllocations (the shared GPU's
// device, updated to exclusive) is not allocated while a share of it is
// still live; with no live share it is, and while it is still published
// as shared a further share is (the two controls).
func TestAllocatorNoExclusiveWhileShared(t *testing.T) {
	shared := demoSlices(t)
	exclusive := demoSlices(t)
	device(t, exclusive, "gpu-5-shared").AllowMultipleAllocations = ptr.To(false)
	share := resource.MustParse("10Gi")

	live := newAllocScheduler(t, shared)
	if d := live.allocate("share", exactly("shared", &share)); d != "gpu-5-shared" {
		t.Fatalf("the first share went to %q", d)
	}
	if d := live.allocate("second-share", exactly("shared", &share)); d != "gpu-5-shared" {
		t.Errorf("a second share of a shared device was not allocated (%q)", d)
	}
	live.published = exclusive
	if d := live.allocate("exclusive", exactly("shared", nil)); d != "" {
		t.Errorf("%s was allocated exclusively while two shares of it are live", d)
	}

	idle := newAllocScheduler(t, exclusive)
	if d := idle.allocate("exclusive", exactly("shared", nil)); d != "gpu-5-shared" {
		t.Errorf("the exclusive device with no live share was not allocated (%q)", d)
	}
}

// allocScheduler is the 1.38 scheduler's allocator over one node's slices,
// with the claims it allocated so far as the scheduler's allocated state.
type allocScheduler struct {
	t         *testing.T
	published []*resourceapi.ResourceSlice
	claims    []resourceapi.AllocationResult
}

func newAllocScheduler(t *testing.T, published []*resourceapi.ResourceSlice) *allocScheduler {
	return &allocScheduler{t: t, published: published}
}

// allocate allocates one claim of req and returns the device it got, ""
// where it got none.
func (s *allocScheduler) allocate(name string, req resourceapi.ExactDeviceRequest) string {
	s.t.Helper()
	alloc, err := structured.NewAllocator(s.t.Context(), schedulerFeatures(), s.state(), allocClasses,
		convert(s.t, s.published), cel.NewCache(10, cel.Features{EnableConsumableCapacity: true}))
	if err != nil {
		s.t.Fatal(err)
	}
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID(name)},
		Spec:       resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "r", Exactly: &req}}}},
	}
	res, err := alloc.Allocate(s.t.Context(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: demoNode}}, []*resourceapi.ResourceClaim{claim})
	if err != nil || len(res) == 0 {
		s.t.Logf("%s: not allocated (%v)", name, err)
		return ""
	}
	s.claims = append(s.claims, res[0])
	return res[0].Devices.Results[0].Device
}

// state is the scheduler's allocated state of the claims allocated so far:
// an exclusive result's device is taken, a share's device has a live share
// and the capacity it consumes.
func (s *allocScheduler) state() structured.AllocatedState {
	st := structured.AllocatedState{AllocatedDevices: sets.New[structured.DeviceID](),
		AllocatedSharedDeviceIDs: sets.New[structured.DeviceID](), AggregatedCapacity: structured.NewConsumedCapacityCollection()}
	for _, c := range s.claims {
		for _, r := range c.Devices.Results {
			id := structured.MakeDeviceID(r.Driver, r.Pool, r.Device)
			if r.ShareID == nil {
				st.AllocatedDevices.Insert(id)
				continue
			}
			st.AllocatedSharedDeviceIDs.Insert(id)
			st.AggregatedCapacity.Insert(structured.NewDeviceConsumedCapacity(id, r.ConsumedCapacity))
		}
	}
	return st
}

// schedulerFeatures are the allocator features a 1.38 kube-scheduler runs
// with by default (its gates' defaults; the DRA gates our slices need are
// GA in 1.38).
func schedulerFeatures() structured.Features {
	on := utilfeature.DefaultFeatureGate.Enabled
	return structured.Features{
		AdminAccess:          on(features.DRAAdminAccess),
		ConsumableCapacity:   on(features.DRAConsumableCapacity),
		DeviceTaints:         on(features.DRADeviceTaints),
		PartitionableDevices: on(features.DRAPartitionableDevices),
		PrioritizedList:      on(features.DRAPrioritizedList),
	}
}

// exactly is a request of one device of class; capacity, where set, is the
// memory it consumes of a shared device.
func exactly(class string, memory *resource.Quantity) resourceapi.ExactDeviceRequest {
	req := resourceapi.ExactDeviceRequest{DeviceClassName: class, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1}
	if memory != nil {
		req.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{"memory": *memory}}
	}
	return req
}

// demoSlices reads the demo node's slices from what hack/writtenobjects
// wrote.
func demoSlices(t *testing.T) []*resourceapi.ResourceSlice {
	t.Helper()
	dir := os.Getenv(objectsEnv)
	if dir == "" {
		t.Fatalf("%s is not set: run make validate-next, which writes the objects first", objectsEnv)
	}
	files, err := filepath.Glob(filepath.Join(dir, "slice-"+demoNode+"-*.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no slices of %s in %s (%v)", demoNode, dir, err)
	}
	var out []*resourceapi.ResourceSlice
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		s := &resourceapi.ResourceSlice{}
		if err := json.Unmarshal(data, s); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		out = append(out, s)
	}
	return out
}

// device is the device named name in the slices.
func device(t *testing.T, in []*resourceapi.ResourceSlice, name string) *resourceapi.Device {
	t.Helper()
	for _, s := range in {
		for i := range s.Spec.Devices {
			if s.Spec.Devices[i].Name == name {
				return &s.Spec.Devices[i]
			}
		}
	}
	t.Fatalf("no device %s in the slices", name)
	return nil
}

// convert gives the slices to the allocator as the 1.38 scheduler's slice
// tracker does (the allocator takes the converted type since 0.38).
func convert(t *testing.T, in []*resourceapi.ResourceSlice) []*draapi.ResourceSlice {
	t.Helper()
	out := make([]*draapi.ResourceSlice, len(in))
	for i, s := range in {
		out[i] = new(draapi.ResourceSlice)
		if err := draapi.Convert_v1_ResourceSlice_To_api_ResourceSlice(s, out[i], nil); err != nil {
			t.Fatalf("converting %s: %v", s.Name, err)
		}
	}
	return out
}

type classLister map[string]*resourceapi.DeviceClass

func (l classLister) List() ([]*resourceapi.DeviceClass, error) {
	var out []*resourceapi.DeviceClass
	for _, c := range l {
		out = append(out, c)
	}
	return out, nil
}

func (l classLister) Get(name string) (*resourceapi.DeviceClass, error) {
	if c, ok := l[name]; ok {
		return c, nil
	}
	return nil, fmt.Errorf("no DeviceClass %s", name)
}

func class(expr string) *resourceapi.DeviceClass {
	return &resourceapi.DeviceClass{Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{
		CEL: &resourceapi.CELDeviceSelector{Expression: `device.driver == "gpu.gpuaas.io" && ` + expr},
	}}}}
}
