package admission

import (
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/shape"
)

func slotShape() *gpuaas.GpuShape {
	return &gpuaas.GpuShape{
		ObjectMeta: metav1.ObjectMeta{Name: "h100-slot", Generation: 1},
		Spec: gpuaas.GpuShapeSpec{
			Requests:  []gpuaas.ShapeRequest{{Name: "gpu", Profile: "h100"}, {Name: "nic", DeviceClassName: "nic.example.com"}},
			Alignment: gpuaas.AlignPCIeRoot,
		},
	}
}

// slotClaim is a claim with the shape's template's spec, under whatever
// name and labels its author chose.
func slotClaim(name string, labels map[string]string) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: name, UID: types.UID("uid-" + name), Labels: labels},
		Spec:       shape.ClaimSpec(slotShape()),
	}
}

// TestAdmitShapeLimit (issue 38 item 5): limits.shapes caps the claims of
// a shape a tenant holds, whatever their names and labels say: a claim
// written by hand to the template's spec is one; reserved and allocated
// ones count, a deleted one frees its slot, a cohort lends none, and a
// claim of the same devices under another spec is charged its devices
// only. The status shows the instances.
func TestAdmitShapeLimit(t *testing.T) {
	objs := append(world(t), nicClass(), slotShape(), ns("a", nil), ns("b", nil),
		tenantQuota("team-a", 0, gpuaas.TenantQuotaSpec{Namespaces: []string{"a"}, Cohort: "research",
			Limits: gpuaas.QuotaLimits{GpuUnits: qty("4"), Shapes: map[string]int64{"h100-slot": 2}}}),
		tenantQuota("team-b", 1, gpuaas.TenantQuotaSpec{Namespaces: []string{"b"}, Cohort: "research",
			Limits: gpuaas.QuotaLimits{GpuUnits: qty("4"), Shapes: map[string]int64{"h100-slot": 8}}}))
	acct, c := newAccountant(t, objs...)
	acct.countShapes.Store(true) // as WatchShapes does, which needs an informer
	admit := func(cl *resourceapi.ResourceClaim) Admission {
		t.Helper()
		adm, err := acct.Admit(ctx(t), cl, false)
		if err != nil {
			t.Fatal(err)
		}
		return adm
	}

	first := allocatedTo(slotClaim("first", map[string]string{gpuaas.ShapeLabel: "h100-slot"}), "node-a", "gpu-0")
	if adm := admit(first); !adm.Allowed {
		t.Fatalf("first instance refused: %s", adm.Reason)
	}
	if err := c.Create(ctx(t), first); err != nil {
		t.Fatal(err)
	}
	// No label, another name: the spec makes it an instance.
	if adm := admit(slotClaim("by-hand", nil)); !adm.Allowed || adm.Cost.Shapes["h100-slot"] != 1 {
		t.Fatalf("hand-written instance: allowed %v (%s), charged %v; want admitted as one instance", adm.Allowed, adm.Reason, adm.Cost.Shapes)
	}
	// The template's requests renamed and reordered ask for the same
	// devices: an instance all the same, not a way around the cap.
	disguised := slotClaim("disguised", nil)
	reqs := disguised.Spec.Devices.Requests
	reqs[0].Name, reqs[1].Name = "b", "a"
	reqs[0], reqs[1] = reqs[1], reqs[0]
	disguised.Spec.Devices.Constraints[0].Requests = []string{"a", "b"}
	if adm := admit(disguised); adm.Allowed || !strings.Contains(adm.Reason, `instances of shape "h100-slot"`) {
		t.Fatalf("renamed and reordered requests: allowed %v (%s), charged %v; want refused by the shape limit", adm.Allowed, adm.Reason, adm.Cost.Shapes)
	}
	adm := admit(slotClaim("third", map[string]string{gpuaas.ShapeLabel: "something-else"}))
	want := `TenantQuota "team-a" exceeded: instances of shape "h100-slot": used 1, reserved 1, requested 1, limit 2 (2 of 2 in use)`
	if adm.Allowed || adm.Reason != want {
		t.Fatalf("third instance: allowed %v, %q\nwant refused: %q", adm.Allowed, adm.Reason, want)
	}
	// The same GPU without the NIC is another spec: not an instance.
	if adm := admit(claim("a", "plain", "h100", 1)); !adm.Allowed || len(adm.Cost.Shapes) != 0 {
		t.Fatalf("plain GPU claim: allowed %v (%s), charged shapes %v", adm.Allowed, adm.Reason, adm.Cost.Shapes)
	}
	rep, err := acct.Report(ctx(t), "team-a")
	if err != nil {
		t.Fatal(err)
	}
	if u := rep.Usage; u.Used.Shapes["h100-slot"] != 1 || u.Reserved.Shapes["h100-slot"] != 1 {
		t.Errorf("status shapes: used %v, reserved %v; want 1 and 1", u.Used.Shapes, u.Reserved.Shapes)
	}

	// Deleting the allocated instance frees a slot.
	if err := c.Delete(ctx(t), first); err != nil {
		t.Fatal(err)
	}
	acct.forgetClaim(first.UID)
	if adm := admit(slotClaim("fourth", nil)); !adm.Allowed {
		t.Fatalf("after a delete: refused: %s", adm.Reason)
	}
	adm = admit(slotClaim("fifth", nil))
	if adm.Allowed || !strings.Contains(adm.Reason, "used 0, reserved 2, requested 1, limit 2") {
		t.Fatalf("fifth instance: allowed %v, %q; want refused with 2 reserved", adm.Allowed, adm.Reason)
	}
}

// nodeShape is the whole-node lease: every H100 of a node.
func nodeShape() *gpuaas.GpuShape {
	return &gpuaas.GpuShape{
		ObjectMeta: metav1.ObjectMeta{Name: "h100-node", Generation: 1},
		Spec:       gpuaas.GpuShapeSpec{Requests: []gpuaas.ShapeRequest{{Name: "gpus", Profile: "h100", AllocationMode: gpuaas.ShapeAll}}},
	}
}

// pairShape is two H100s on one NUMA node.
func pairShape() *gpuaas.GpuShape {
	return &gpuaas.GpuShape{
		ObjectMeta: metav1.ObjectMeta{Name: "numa-pair", Generation: 1},
		Spec: gpuaas.GpuShapeSpec{
			Requests:  []gpuaas.ShapeRequest{{Name: "gpus", Profile: "h100", Count: ptr.To[int64](2)}},
			Alignment: gpuaas.AlignNUMANode,
		},
	}
}

// TestAdmitShapeLimitCountsTheDevicesAskedAnotherWay (issue 55 route 1):
// a shape's cap counts what a claim holds, not how it is written. With
// shapes {h100-node: 0, numa-pair: 0, h100-slot: 1}, the whole-node lease
// as a firstAvailable of one alternative, the NUMA pair with its
// constraint written twice, the pair split into two count-1 requests
// under one constraint, and two GPU+NIC slots in one claim are each
// refused by the cap; a firstAvailable is charged its worst alternative's
// instances, and one slot is admitted.
func TestAdmitShapeLimitCountsTheDevicesAskedAnotherWay(t *testing.T) {
	objs := append(world(t), nicClass(), nodeShape(), pairShape(), slotShape(), ns("a", nil),
		tenantQuota("team-a", 0, gpuaas.TenantQuotaSpec{Namespaces: []string{"a"},
			Limits: gpuaas.QuotaLimits{GpuUnits: qty("16"), Shapes: map[string]int64{"h100-node": 0, "numa-pair": 0, "h100-slot": 1}}}))
	acct, _ := newAccountant(t, objs...)
	acct.countShapes.Store(true) // as WatchShapes does, which needs an informer
	numa := resourceapi.FullyQualifiedName("resource.kubernetes.io/numaNode")
	h100 := func(name string, count int64) resourceapi.DeviceRequest {
		return resourceapi.DeviceRequest{Name: name, Exactly: &resourceapi.ExactDeviceRequest{
			DeviceClassName: "h100", AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: count}}
	}
	spec := func(reqs []resourceapi.DeviceRequest, cs ...resourceapi.DeviceConstraint) *resourceapi.ResourceClaim {
		c := slotClaim("x", nil)
		c.Spec = resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: reqs, Constraints: cs}}
		return c
	}
	onNUMA := resourceapi.DeviceConstraint{MatchAttribute: ptr.To(numa)}
	twoSlots := shape.ClaimSpec(slotShape())
	for _, r := range shape.ClaimSpec(slotShape()).Devices.Requests {
		r.Name += "-2"
		twoSlots.Devices.Requests = append(twoSlots.Devices.Requests, r)
	}
	slots := slotClaim("two-slots", nil)
	slots.Spec = twoSlots
	pairOrOne := spec([]resourceapi.DeviceRequest{{Name: "gpus", FirstAvailable: []resourceapi.DeviceSubRequest{
		{Name: "one", DeviceClassName: "h100", AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1},
		{Name: "pair", DeviceClassName: "h100", AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 2},
	}}}, onNUMA)

	for name, tc := range map[string]struct {
		claim *resourceapi.ResourceClaim
		shape string
		want  int64
	}{
		"lease as one alternative": {spec([]resourceapi.DeviceRequest{{Name: "gpus", FirstAvailable: []resourceapi.DeviceSubRequest{
			{Name: "all", DeviceClassName: "h100", AllocationMode: resourceapi.DeviceAllocationModeAll}}}}), "h100-node", 1},
		"pair, constraint twice":        {spec([]resourceapi.DeviceRequest{h100("gpus", 2)}, onNUMA, onNUMA), "numa-pair", 1},
		"pair split in two requests":    {spec([]resourceapi.DeviceRequest{h100("a", 1), h100("b", 1)}, onNUMA), "numa-pair", 1},
		"two slots in one claim":        {slots, "h100-slot", 2},
		"pair as the worst alternative": {pairOrOne, "numa-pair", 1},
	} {
		adm, err := acct.Admit(ctx(t), tc.claim, false)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if adm.Allowed || adm.Cost.Shapes[tc.shape] != tc.want || !strings.Contains(adm.Reason, `instances of shape "`+tc.shape+`"`) {
			t.Errorf("%s: allowed %v (%s), charged shapes %v; want refused, %d instance(s) of %s", name, adm.Allowed, adm.Reason, adm.Cost.Shapes, tc.want, tc.shape)
		}
	}
	if adm, err := acct.Admit(ctx(t), slotClaim("one-slot", nil), false); err != nil || !adm.Allowed || adm.Cost.Shapes["h100-slot"] != 1 {
		t.Errorf("one slot: %+v, %v; want admitted as one instance", adm.Decision, err)
	}
}
