package shapes_test

import (
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller/shapes"
	"github.com/gpuaas/gpu-dra-driver/pkg/shape"
)

// TestRefuserRecognisesClaimsBySpec: with whenUnavailable Refuse and
// nothing placeable, a claim whose spec is the template's, in a namespace
// holding the template, is refused with the message form of issue 38;
// labels prove nothing, a different spec or namespace is not the shape's,
// and Queue, a placeable count or a status not yet written refuse nothing.
func TestRefuserRecognisesClaimsBySpec(t *testing.T) {
	s := slotShape()
	s.Spec.WhenUnavailable = gpuaas.Refuse
	c := world(t, s)
	reconcileShape(t, c, "h100-slot") // status: templates in a1, a2
	var claim resourceapi.ResourceClaim
	take := func(ns, name string, spec resourceapi.ResourceClaimSpec) *resourceapi.ResourceClaim {
		claim = resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: spec}
		return &claim
	}
	// Take node-a's r0 GPU: nothing aligned is left.
	taken := take("a1", "taken", resourceapi.ResourceClaimSpec{})
	taken.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{
		Request: "gpu", Driver: "gpu.gpuaas.io", Pool: "node-a", Device: "gpu-0"}}}}
	if err := c.Create(t.Context(), taken); err != nil {
		t.Fatal(err)
	}
	got := reconcileShape(t, c, "h100-slot")
	if got.Status.Placeable != 0 {
		t.Fatalf("placeable = %d", got.Status.Placeable)
	}
	r := shapes.NewRefuser(c)
	refuse := func(cl *resourceapi.ResourceClaim) string {
		t.Helper()
		why, err := r.Refuse(t.Context(), cl)
		if err != nil {
			t.Fatal(err)
		}
		return why
	}
	want := "unavailable: shape h100-slot has 0 placeable (0 of 2 nodes have a free GPU+NIC on one PCIe root)"
	if why := refuse(take("a1", "mine", shape.ClaimSpec(s))); why != want {
		t.Fatalf("refusal = %q, want %q", why, want)
	}
	if why := refuse(take("b1", "elsewhere", shape.ClaimSpec(s))); why != "" {
		t.Errorf("a claim where the shape has no template refused: %q", why)
	}
	other := shape.ClaimSpec(s)
	other.Devices.Constraints = nil
	labeled := take("a1", "labeled", other)
	labeled.Labels = map[string]string{gpuaas.ShapeLabel: "h100-slot"}
	if why := refuse(labeled); why != "" {
		t.Errorf("a claim of another spec refused for its label: %q", why)
	}

	got.Spec.WhenUnavailable = gpuaas.Queue
	if err := c.Update(t.Context(), got); err != nil {
		t.Fatal(err)
	}
	if why := refuse(take("a1", "queued", shape.ClaimSpec(s))); why != "" {
		t.Errorf("refused under Queue: %q", why)
	}
	var none *shapes.Refuser // the GpuShape CRD not installed
	if w, err := none.Refuse(t.Context(), take("a1", "no-crd", shape.ClaimSpec(s))); w != "" || err != nil {
		t.Errorf("nil Refuser: %q %v", w, err)
	}
}

// TestRefuserWaitsForACount: a shape whose status was never written (no
// count yet) refuses nothing.
func TestRefuserWaitsForACount(t *testing.T) {
	s := slotShape()
	s.Spec.WhenUnavailable = gpuaas.Refuse
	s.Status.Namespaces = []string{"a1"}
	c := world(t, s)
	claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "a1", Name: "x"}, Spec: shape.ClaimSpec(s)}
	if why, err := shapes.NewRefuser(c).Refuse(t.Context(), claim); why != "" || err != nil {
		t.Fatalf("refused before any count: %q %v", why, err)
	}
}
