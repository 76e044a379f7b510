package shape_test

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/klog/v2/ktesting"

	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	_ "github.com/gpuaas/gpu-dra-driver/pkg/nvdev/nvmock" // the mock: backends
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/inventory"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/prepare/preparetest"
	"github.com/gpuaas/gpu-dra-driver/pkg/shape"
)

// These tests check shape.Placeable against the scheduler's allocator on
// the plugin's own slices. They live here, on the controller's side, and
// not in pkg/plugin: shape links pkg/quota, whose CEL pricing does not
// build on the 0.38 libraries, and pkg/plugin's tests must (make
// plugin-next, issue 57).

// Classes of a whole-node lease and of the small devices it must keep off
// its GPUs.
const (
	wholeGPUExpr = `device.driver == "gpu.gpuaas.io" && device.attributes["gpu.gpuaas.io"].type == "gpu"`
	mig1gExpr    = `device.driver == "gpu.gpuaas.io" && device.attributes["gpu.gpuaas.io"].type == "mig" && device.attributes["gpu.gpuaas.io"].profile == "1g.10gb"`
	replicaExpr  = `device.driver == "gpu.gpuaas.io" && device.attributes["gpu.gpuaas.io"].type == "timeslice"`
)

// scheduler is the kube-scheduler's allocator over one node's slices (the
// plugin's, as it publishes them), with the claims allocated so far.
type scheduler struct {
	t         *testing.T
	published []*resourceapi.ResourceSlice
	converted preparetest.SchedulerSlices
	classes   preparetest.ClassLister
	allocated []*resourceapi.ResourceClaim
}

func (s *scheduler) allocate(name string, req resourceapi.ExactDeviceRequest) bool {
	s.t.Helper()
	taken := sets.New[structured.DeviceID]()
	for _, c := range s.allocated {
		for _, r := range c.Status.Allocation.Devices.Results {
			taken.Insert(structured.MakeDeviceID(r.Driver, r.Pool, r.Device))
		}
	}
	alloc, err := structured.NewAllocator(s.t.Context(), preparetest.SchedulerFeatures, structured.AllocatedState{AllocatedDevices: taken},
		s.classes, s.converted, cel.NewCache(10, cel.Features{EnableConsumableCapacity: true}))
	if err != nil {
		s.t.Fatal(err)
	}
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID(name)},
		Spec:       resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "r", Exactly: &req}}}},
	}
	res, err := alloc.Allocate(s.t.Context(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: preparetest.Node}}, []*resourceapi.ResourceClaim{claim})
	if err != nil || len(res) == 0 {
		s.t.Logf("%s: not allocated (%v)", name, err)
		return false
	}
	claim.Status.Allocation = &res[0]
	s.allocated = append(s.allocated, claim)
	return true
}

// placeable is shape.Placeable of one request of expr on the node.
func (s *scheduler) placeable(expr string, all bool) int {
	q := shape.Query{Requests: []shape.Request{{Name: "r", Selectors: []string{expr}, All: all, Count: 1}}}
	return shape.Placeable(context.Background(), q, s.published, s.allocated, nil).Placeable
}

var (
	lease = resourceapi.ExactDeviceRequest{DeviceClassName: "whole", AllocationMode: resourceapi.DeviceAllocationModeAll}
	one   = func(class string) resourceapi.ExactDeviceRequest {
		return resourceapi.ExactDeviceRequest{DeviceClassName: class, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1}
	}
)

func newScheduler(t *testing.T, cfg *configapi.NodeConfig) *scheduler {
	e := preparetest.NewEnv(t, "dgxh100", cfg, "")
	published := preparetest.APISlices(inventory.Resources(preparetest.Node, inventory.Discover(ktesting.NewLogger(t, ktesting.NewConfig()), e.Lib, cfg)))
	return &scheduler{t: t, published: published, converted: preparetest.ForScheduler(t, published), classes: preparetest.ClassLister{
		"whole":   preparetest.CELClass("whole", wholeGPUExpr),
		"mig-1g":  preparetest.CELClass("mig-1g", mig1gExpr),
		"replica": preparetest.CELClass("replica", replicaExpr),
	}}
}

// TestWholeNodeLeaseBlocksSmallerDevices (issue 38 item 2): with every GPU
// offered as dynamic MIG, a whole-node lease (allocationMode All over the
// whole GPUs) takes all 8, and then the scheduler's allocator places no
// MIG device on the node: each whole GPU consumes all of its GPU's
// counters. The other way round, one MIG device taken keeps the lease off
// the node (All needs every matching device). shape.Placeable agrees with
// the allocator at every step.
func TestWholeNodeLeaseBlocksSmallerDevices(t *testing.T) {
	s := newScheduler(t, preparetest.DynamicAll())
	if got := s.placeable(wholeGPUExpr, true); got != 1 {
		t.Fatalf("placeable leases on an idle node = %d, want 1", got)
	}
	if !s.allocate("lease", lease) {
		t.Fatal("the lease was not allocated on an idle node")
	}
	if n := len(s.allocated[0].Status.Allocation.Devices.Results); n != 8 {
		t.Fatalf("the lease got %d devices, want 8", n)
	}
	if s.allocate("mig-under-lease", one("mig-1g")) {
		t.Fatal("a MIG device was allocated on a GPU of the leased node")
	}
	if got := s.placeable(mig1gExpr, false); got != 0 {
		t.Errorf("placeable MIG devices under the lease = %d, want 0", got)
	}

	s = newScheduler(t, preparetest.DynamicAll())
	if !s.allocate("mig-first", one("mig-1g")) {
		t.Fatal("no MIG device on an idle node")
	}
	if got := s.placeable(wholeGPUExpr, true); got != 0 {
		t.Errorf("placeable leases with a MIG device taken = %d, want 0", got)
	}
	if s.allocate("lease-after-mig", lease) {
		t.Error("the lease was allocated on a node with a MIG device taken")
	}
}

// TestWholeNodeLeaseOnReplicaNodes: a node that offers its GPUs as
// time-slice replicas publishes no whole-GPU device, so a lease over whole
// GPUs matches nothing there and is never placed (All of nothing fails):
// the count and the allocator agree, and a replica node is out of the
// lease's candidates rather than half-leased. (On a node with some GPUs in
// replicas and others whole, All would take only the whole ones:
// docs/platform.md says to sell leases on nodes whose GPUs are all whole
// or dynamic MIG.)
func TestWholeNodeLeaseOnReplicaNodes(t *testing.T) {
	s := newScheduler(t, &configapi.NodeConfig{Default: configapi.GpuMode{TimeSlicing: &configapi.TimeSlicingMode{Replicas: 4}}})
	if got := s.placeable(wholeGPUExpr, true); got != 0 {
		t.Errorf("placeable leases on a replica node = %d, want 0", got)
	}
	if s.allocate("lease", lease) {
		t.Fatal("a lease over whole GPUs was allocated on a replica node")
	}
	if !s.allocate("replica", one("replica")) {
		t.Fatal("no replica on an idle replica node")
	}
}
