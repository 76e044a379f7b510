package shapes_test

import (
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller/internal/testworld"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller/shapes"
)

const nicDriver = "nic.example.com"

// nicClass selects another driver's NICs.
func nicClass() *resourceapi.DeviceClass {
	return &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "nic"},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
			Expression: `device.driver == "nic.example.com"`}}}}}
}

func slotShape() *gpuaas.GpuShape {
	return &gpuaas.GpuShape{
		ObjectMeta: metav1.ObjectMeta{Name: "h100-slot", UID: "shape-uid", Generation: 1},
		Spec: gpuaas.GpuShapeSpec{
			Requests: []gpuaas.ShapeRequest{
				{Name: "gpu", Profile: "h100"},
				{Name: "nic", DeviceClassName: "nic"},
			},
			Alignment: gpuaas.AlignPCIeRoot,
			Tenants:   []string{"team-a"},
		},
	}
}

func rooted(d resourceapi.Device, root string) resourceapi.Device {
	d.Attributes["resource.kubernetes.io/pcieRoot"] = testworld.Attr(root)
	return d
}

// world: team-a owns a1 and a2 (and names a3, which does not exist),
// team-b owns b1; node-a has GPUs on roots r0 and r1 and a NIC on r0;
// node-c a GPU and a NIC on different roots.
func world(t *testing.T, extra ...client.Object) client.Client {
	t.Helper()
	h100 := testworld.GpuProfile("h100", gpuaas.ProfileSelector{Type: "gpu"})
	nicA := rooted(resourceapi.Device{Name: "nic-0", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{}}, "r0")
	nicC := rooted(resourceapi.Device{Name: "nic-0", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{}}, "r1")
	nicSliceA := testworld.ResourceSlice("node-a", nicA)
	nicSliceA.Name, nicSliceA.Spec.Driver = "nic-node-a", nicDriver
	nicSliceC := testworld.ResourceSlice("node-c", nicC)
	nicSliceC.Name, nicSliceC.Spec.Driver = "nic-node-c", nicDriver
	objs := []client.Object{
		h100, testworld.ClassOf(t, h100), nicClass(),
		testworld.ResourceSlice("node-a", rooted(testworld.WholeGPU(0), "r0"), rooted(testworld.WholeGPU(1), "r1")), nicSliceA,
		testworld.ResourceSlice("node-c", rooted(testworld.WholeGPU(0), "r0")), nicSliceC,
		testworld.TenantQuota("team-a", 0, gpuaas.TenantQuotaSpec{Namespaces: []string{"a1", "a2", "a3"}}),
		testworld.TenantQuota("team-b", 1, gpuaas.TenantQuotaSpec{Namespaces: []string{"b1"}}),
		testworld.Namespace("a1", nil), testworld.Namespace("a2", nil), testworld.Namespace("b1", nil),
	}
	return testworld.NewFakeClient(t, append(objs, extra...)...)
}

func reconcileShape(t *testing.T, c client.Client, name string) *gpuaas.GpuShape {
	t.Helper()
	r := shapes.NewReconciler(c, c, time.Minute)
	if _, err := r.Reconcile(t.Context(), reconcile.Request{NamespacedName: types.NamespacedName{Name: name}}); err != nil {
		t.Fatalf("reconcile: %v", err)
	}
	var s gpuaas.GpuShape
	if err := c.Get(t.Context(), types.NamespacedName{Name: name}, &s); err != nil {
		t.Fatal(err)
	}
	return &s
}

func ready(t *testing.T, s *gpuaas.GpuShape) *metav1.Condition {
	t.Helper()
	c := meta.FindStatusCondition(s.Status.Conditions, gpuaas.ConditionReady)
	if c == nil {
		t.Fatal("no Ready condition")
	}
	return c
}

func template(t *testing.T, c client.Client, ns string) *resourceapi.ResourceClaimTemplate {
	t.Helper()
	var tpl resourceapi.ResourceClaimTemplate
	err := c.Get(t.Context(), types.NamespacedName{Namespace: ns, Name: "h100-slot"}, &tpl)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return &tpl
}

// TestShapeRendersTemplates: one template per existing namespace of an
// entitled tenant, none elsewhere, and the placeable count in status.
func TestShapeRendersTemplates(t *testing.T) {
	c := world(t, slotShape())
	s := reconcileShape(t, c, "h100-slot")
	if cond := ready(t, s); cond.Status != metav1.ConditionTrue || cond.Reason != gpuaas.ReasonShapeReady {
		t.Fatalf("Ready = %+v", cond)
	}
	if strings.Join(s.Status.Namespaces, ",") != "a1,a2" || s.Status.Templates != 2 {
		t.Fatalf("namespaces = %v, templates %d", s.Status.Namespaces, s.Status.Templates)
	}
	for _, ns := range []string{"a1", "a2"} {
		tpl := template(t, c, ns)
		if tpl == nil || tpl.Labels[gpuaas.ShapeLabel] != "h100-slot" || len(tpl.Spec.Spec.Devices.Requests) != 2 ||
			ptr.Deref(tpl.Spec.Spec.Devices.Constraints[0].MatchAttribute, "") != "resource.kubernetes.io/pcieRoot" {
			t.Fatalf("template in %s = %+v", ns, tpl)
		}
	}
	if template(t, c, "b1") != nil {
		t.Fatal("a template in team-b's namespace")
	}
	if s.Status.Placeable != 1 || s.Status.PlaceableMessage != "1 of 2 nodes have a free GPU+NIC on one PCIe root" {
		t.Fatalf("placeable = %d %q", s.Status.Placeable, s.Status.PlaceableMessage)
	}
	// The GPU of r0 on node-a taken: nothing aligned left.
	claim := testworld.AllocatedTo(testworld.Claim("a1", "taken", "h100", 1), "node-a", "gpu-0")
	if err := c.Create(t.Context(), claim); err != nil {
		t.Fatal(err)
	}
	s = reconcileShape(t, c, "h100-slot")
	if s.Status.Placeable != 0 || s.Status.PlaceableMessage != "0 of 2 nodes have a free GPU+NIC on one PCIe root" {
		t.Fatalf("placeable with r0 taken = %d %q", s.Status.Placeable, s.Status.PlaceableMessage)
	}
}

// TestShapeCountLeavesOutDrainedDevices: with DeviceTaintRules served
// (WithDrains), a GPU an admin's rule drains is not placeable.
func TestShapeCountLeavesOutDrainedDevices(t *testing.T) {
	drain := &resourceapi.DeviceTaintRule{ObjectMeta: metav1.ObjectMeta{Name: "maintenance"}, Spec: resourceapi.DeviceTaintRuleSpec{
		DeviceSelector: &resourceapi.DeviceTaintSelector{Driver: ptr.To(testworld.Driver), Pool: ptr.To("node-a"), Device: ptr.To("gpu-0")},
		Taint:          resourceapi.DeviceTaint{Key: "example.com/maintenance", Effect: resourceapi.DeviceTaintEffectNoSchedule},
	}}
	c := world(t, slotShape(), drain)
	r := shapes.NewReconciler(c, c, time.Minute).WithDrains()
	if _, err := r.Reconcile(t.Context(), reconcile.Request{NamespacedName: types.NamespacedName{Name: "h100-slot"}}); err != nil {
		t.Fatal(err)
	}
	var s gpuaas.GpuShape
	if err := c.Get(t.Context(), types.NamespacedName{Name: "h100-slot"}, &s); err != nil {
		t.Fatal(err)
	}
	if s.Status.Placeable != 0 || s.Status.PlaceableMessage != "0 of 2 nodes have a free GPU+NIC on one PCIe root" {
		t.Fatalf("placeable with node-a's gpu-0 drained = %d %q", s.Status.Placeable, s.Status.PlaceableMessage)
	}
}

// TestShapeKeepsTemplatesInSync: a deleted template comes back, an edited
// one is replaced, a removed label is put back, a namespace no longer
// entitled loses its template, and someone else's template of the name is
// left alone and reported.
func TestShapeKeepsTemplatesInSync(t *testing.T) {
	c := world(t, slotShape())
	reconcileShape(t, c, "h100-slot")

	if err := c.Delete(t.Context(), template(t, c, "a1")); err != nil {
		t.Fatal(err)
	}
	edited := template(t, c, "a2")
	edited.Spec.Spec.Devices.Requests[0].Exactly.Count = 4
	delete(edited.Labels, gpuaas.ShapeLabel)
	if err := c.Update(t.Context(), edited); err != nil {
		t.Fatal(err)
	}
	reconcileShape(t, c, "h100-slot")
	if template(t, c, "a1") == nil {
		t.Fatal("deleted template not re-created")
	}
	if got := template(t, c, "a2"); got.Spec.Spec.Devices.Requests[0].Exactly.Count != 1 || got.Labels[gpuaas.ShapeLabel] != "h100-slot" {
		t.Fatalf("edited template not reverted: %+v", got)
	}

	var q gpuaas.TenantQuota
	if err := c.Get(t.Context(), types.NamespacedName{Name: "team-a"}, &q); err != nil {
		t.Fatal(err)
	}
	q.Spec.Namespaces = []string{"a1"}
	if err := c.Update(t.Context(), &q); err != nil {
		t.Fatal(err)
	}
	s := reconcileShape(t, c, "h100-slot")
	if template(t, c, "a2") != nil || strings.Join(s.Status.Namespaces, ",") != "a1" {
		t.Fatalf("a2's template kept after team-a dropped it: %v", s.Status.Namespaces)
	}

	theirs := &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: "a2", Name: "h100-slot"}}
	theirs.Spec.Spec.Devices.Requests = []resourceapi.DeviceRequest{{Name: "x", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "h100", AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1}}}
	q.Spec.Namespaces = []string{"a1", "a2"}
	if err := c.Update(t.Context(), &q); err != nil {
		t.Fatal(err)
	}
	if err := c.Create(t.Context(), theirs); err != nil {
		t.Fatal(err)
	}
	s = reconcileShape(t, c, "h100-slot")
	cond := ready(t, s)
	if cond.Status != metav1.ConditionFalse || cond.Reason != gpuaas.ReasonTemplateConflict || !strings.Contains(cond.Message, "a2/h100-slot") {
		t.Fatalf("Ready = %+v", cond)
	}
	if got := template(t, c, "a2"); got.Spec.Spec.Devices.Requests[0].Name != "x" || metav1.GetControllerOf(got) != nil {
		t.Fatalf("someone else's template was changed: %+v", got)
	}
}

// TestShapeNamesMissingParts: a class that does not exist and a profile
// disabled are named in the Ready condition; nothing is placeable.
func TestShapeNamesMissingParts(t *testing.T) {
	c := world(t, slotShape())
	if err := c.Delete(t.Context(), nicClass()); err != nil {
		t.Fatal(err)
	}
	s := reconcileShape(t, c, "h100-slot")
	cond := ready(t, s)
	if cond.Status != metav1.ConditionFalse || cond.Reason != gpuaas.ReasonPartsMissing || cond.Message != `request nic: DeviceClass "nic" does not exist` {
		t.Fatalf("Ready = %+v", cond)
	}
	if s.Status.Placeable != 0 {
		t.Fatalf("placeable = %d with a part missing", s.Status.Placeable)
	}
	var p gpuaas.GpuProfile
	if err := c.Get(t.Context(), types.NamespacedName{Name: "h100"}, &p); err != nil {
		t.Fatal(err)
	}
	p.Spec.Enabled = ptr.To(false)
	if err := c.Update(t.Context(), &p); err != nil {
		t.Fatal(err)
	}
	if err := c.Create(t.Context(), nicClass()); err != nil {
		t.Fatal(err)
	}
	cond = ready(t, reconcileShape(t, c, "h100-slot"))
	if cond.Reason != gpuaas.ReasonPartsMissing || cond.Message != `request gpu: GpuProfile "h100" is disabled` {
		t.Fatalf("Ready = %+v", cond)
	}
}
