package shapes_test

import (
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller/internal/testworld"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller/shapes"
	"github.com/gpuaas/gpu-dra-driver/pkg/quota"
)

// TestShapeCountsOtherDriversNICsFromTheirCache (issue 52): the manager's
// cache holds only our driver's slices, and the GPU+NIC slot's NICs are
// another driver's: the count reads them from the cache of other drivers'
// slices (ForeignSliceCache, the leader's only), and finds the one node
// with a GPU and a NIC on one PCIe root as before.
func TestShapeCountsOtherDriversNICsFromTheirCache(t *testing.T) {
	c := world(t, slotShape())
	var all resourceapi.ResourceSliceList
	if err := c.List(t.Context(), &all); err != nil {
		t.Fatal(err)
	}
	var theirs []client.Object
	for i := range all.Items {
		if s := &all.Items[i]; s.Spec.Driver != quota.DriverName {
			theirs = append(theirs, s.DeepCopy())
			if err := c.Delete(t.Context(), s); err != nil {
				t.Fatal(err)
			}
		}
	}
	if len(theirs) != 2 {
		t.Fatalf("the world has %d slices of another driver, want the 2 NIC slices", len(theirs))
	}
	foreign := testworld.NewFakeClient(t, theirs...)
	r := shapes.NewReconciler(c, c, time.Minute).WithForeignSlices(foreign)
	if _, err := r.Reconcile(t.Context(), reconcile.Request{NamespacedName: types.NamespacedName{Name: "h100-slot"}}); err != nil {
		t.Fatal(err)
	}
	var s gpuaas.GpuShape
	if err := c.Get(t.Context(), types.NamespacedName{Name: "h100-slot"}, &s); err != nil {
		t.Fatal(err)
	}
	if s.Status.Placeable != 1 || s.Status.PlaceableMessage != "1 of 2 nodes have a free GPU+NIC on one PCIe root" {
		t.Fatalf("placeable = %d %q; want the NIC of node-a counted", s.Status.Placeable, s.Status.PlaceableMessage)
	}
}

// TestForeignSliceCacheKeepsWhatShapesRead: the cache of a driver's slices
// selects them by spec.driver (that driver's; for AnyDriver every driver's
// but ours, which are in the manager's), and keeps of each what the count reads: the spec of a node's slice, without
// managedFields, labels, annotations and owners; of a slice not on one node
// (the count places instances on nodes) no devices.
func TestForeignSliceCacheKeepsWhatShapesRead(t *testing.T) {
	anyDriver := shapes.ForeignSliceCache(shapes.AnyDriver)
	if anyDriver.Field == nil || anyDriver.Field.Matches(fields.Set{"spec.driver": quota.DriverName}) ||
		!anyDriver.Field.Matches(fields.Set{"spec.driver": "nic.example.com"}) {
		t.Fatalf("field selector %v: want every driver's slices but ours", anyDriver.Field)
	}
	bo := shapes.ForeignSliceCache("nic.example.com")
	if bo.Field == nil || !bo.Field.Matches(fields.Set{"spec.driver": "nic.example.com"}) ||
		bo.Field.Matches(fields.Set{"spec.driver": "gpu.example.com"}) {
		t.Fatalf("field selector %v: want nic.example.com's slices only", bo.Field)
	}
	nic := rooted(resourceapi.Device{Name: "nic-0", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{}}, "r0")
	onNode := testworld.ResourceSlice("node-a", nic)
	onNode.Spec.Driver = "nic.example.com"
	onNode.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "nic-plugin"}}
	onNode.Labels, onNode.Annotations = map[string]string{"a": "b"}, map[string]string{"c": "d"}
	onNode.OwnerReferences = []metav1.OwnerReference{{Kind: "Node", Name: "node-a"}}
	out, err := bo.Transform(onNode.DeepCopy())
	if err != nil {
		t.Fatal(err)
	}
	got := out.(*resourceapi.ResourceSlice)
	if got.ManagedFields != nil || got.Labels != nil || got.Annotations != nil || got.OwnerReferences != nil {
		t.Errorf("cached metadata %+v; want only what identifies the slice", got.ObjectMeta)
	}
	if got.Name != onNode.Name || len(got.Spec.Devices) != 1 || ptr.Deref(got.Spec.NodeName, "") != "node-a" {
		t.Errorf("a node's slice cached as %+v; want its spec whole", got)
	}
	network := onNode.DeepCopy()
	network.Spec.NodeName, network.Spec.AllNodes = nil, ptr.To(true)
	out, err = bo.Transform(network)
	if err != nil {
		t.Fatal(err)
	}
	if got := out.(*resourceapi.ResourceSlice); len(got.Spec.Devices) != 0 {
		t.Errorf("a slice of all nodes cached with %d devices; the count reads none of them", len(got.Spec.Devices))
	}
}
