package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

// TestControllerShapeQuota (issue 38 item 5): a TenantQuota's
// limits.shapes caps its instances of a shape. The tenant's own
// ServiceAccount makes claims from the shape's template: two are admitted,
// the third refused with the quota's message; deleting one frees its slot;
// a claim the tenant writes by hand to the same spec, labeled as another
// shape, is charged as an instance; a claim of the GPU alone is not. The
// status shows the instances reserved.
func TestControllerShapeQuota(t *testing.T) {
	rc := startController(t)
	ctx := framework.Context(t, 3*time.Minute)
	name := uniqueName("capped")
	_, nicClass := shapeParts(t, name, fmt.Sprintf("device.driver == %q", e2eNICDriver))
	ns := cp.CreateNamespace(t, "capped")
	tenant, err := cp.NewTenant(ctx, ns, "team")
	if err != nil {
		t.Fatal(err)
	}
	createObject(t, quotaFor(name, []string{ns}, gpuaas.QuotaLimits{Shapes: map[string]int64{name: 2}}))
	createObject(t, &gpuaas.GpuShape{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: gpuaas.GpuShapeSpec{
			Requests:  []gpuaas.ShapeRequest{{Name: "gpu", Profile: name}, {Name: "nic", DeviceClassName: nicClass.Name}},
			Alignment: gpuaas.AlignPCIeRoot,
			Tenants:   []string{name},
		},
	})
	waitForShape(t, name, "rendered", func(s *gpuaas.GpuShape) bool { return s.Status.Templates == 1 })
	tpl, err := tenant.Client.ResourceV1().ResourceClaimTemplates(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the tenant reading its template: %v", err)
	}
	create := func(c *resourceapi.ResourceClaim) error {
		_, err := tenant.Client.ResourceV1().ResourceClaims(ns).Create(ctx, c, metav1.CreateOptions{})
		return err
	}
	fromTemplate := func(claimName string) *resourceapi.ResourceClaim {
		return &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: claimName}, Spec: tpl.Spec.Spec}
	}
	for _, n := range []string{"one", "two"} {
		if err := create(fromTemplate(n)); err != nil {
			t.Fatalf("instance %s refused under the limit: %v", n, err)
		}
	}
	full := fmt.Sprintf(`TenantQuota %q exceeded: instances of shape %q: used 0, reserved 2, requested 1, limit 2 (2 of 2 in use)`, name, name)
	err = create(fromTemplate("three"))
	mustDeny(t, err, full)
	waitForQuota(t, name, "showing 2 instances reserved", func(q *gpuaas.TenantQuota) bool {
		return q.Status.Reserved.Shapes[name] == 2
	})

	if err := tenant.Client.ResourceV1().ResourceClaims(ns).Delete(ctx, "one", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// Written by hand, labeled as another shape: its spec makes it one of
	// this shape, admitted into the slot the delete freed (once the
	// controller's cache has seen the delete, as the claim's creator
	// retries).
	byHand := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "by-hand", Labels: map[string]string{gpuaas.ShapeLabel: "something-else"}},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{
				{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: name, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1}},
				{Name: "nic", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: nicClass.Name, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1}},
			},
			Constraints: []resourceapi.DeviceConstraint{{MatchAttribute: ptr.To[resourceapi.FullyQualifiedName]("resource.kubernetes.io/pcieRoot")}},
		}},
	}
	var last error
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		last = create(byHand)
		return last == nil, nil
	})
	if err != nil {
		t.Fatalf("hand-written claim not admitted after a delete freed a slot: %v", last)
	}
	mustDeny(t, create(fromTemplate("three")), full)
	if err := create(gpuClaim(ns, "gpu-alone", name, 1)); err != nil {
		t.Fatalf("a claim of the GPU alone refused: %v", err)
	}
	waitForQuota(t, name, "still showing 2 instances", func(q *gpuaas.TenantQuota) bool {
		return q.Status.Reserved.Shapes[name] == 2 && q.Status.ClaimsCounted == 3
	})
	rc.alive(t)
}

// TestControllerShapeQuotaCountsTheDevicesAskedAnotherWay (issue 55 route
// 1): with shapes {node: 0, pair: 0, slot: 1}, the tenant's own
// ServiceAccount asks for the same devices without the templates' specs:
// the whole-node lease as a firstAvailable of one alternative, the NUMA
// pair with its constraint written twice, the pair split into two count-1
// requests under one constraint, and two GPU+NIC slots in one claim. Each
// is refused by the shape cap; one slot is admitted.
func TestControllerShapeQuotaCountsTheDevicesAskedAnotherWay(t *testing.T) {
	rc := startController(t)
	ctx := framework.Context(t, 3*time.Minute)
	name := uniqueName("asked")
	product, nicClass := shapeParts(t, name, fmt.Sprintf("device.driver == %q", e2eNICDriver))
	node := name + "-node"
	var gpus []resourceapi.Device
	for i := range 4 {
		d := e2eShapeGPU(fmt.Sprintf("gpu-%d", i), product, "pci0000:00")
		d.Attributes["resource.kubernetes.io/numaNode"] = resourceapi.DeviceAttribute{IntValue: ptr.To[int64](0)}
		gpus = append(gpus, d)
	}
	createObject(t, e2eSlice(name+"-gpus", "gpu.gpuaas.io", node, gpus))
	ns := cp.CreateNamespace(t, "asked")
	tenant, err := cp.NewTenant(ctx, ns, "team")
	if err != nil {
		t.Fatal(err)
	}
	nodeShape, pairShape, slotShape := name+"-node", name+"-pair", name+"-slot"
	createObject(t, quotaFor(name, []string{ns}, gpuaas.QuotaLimits{Shapes: map[string]int64{nodeShape: 0, pairShape: 0, slotShape: 1}}))
	for _, s := range []*gpuaas.GpuShape{
		{ObjectMeta: metav1.ObjectMeta{Name: nodeShape}, Spec: gpuaas.GpuShapeSpec{
			Requests: []gpuaas.ShapeRequest{{Name: "gpus", Profile: name, AllocationMode: gpuaas.ShapeAll}}}},
		{ObjectMeta: metav1.ObjectMeta{Name: pairShape}, Spec: gpuaas.GpuShapeSpec{
			Requests: []gpuaas.ShapeRequest{{Name: "gpus", Profile: name, Count: ptr.To[int64](2)}}, Alignment: gpuaas.AlignNUMANode}},
		{ObjectMeta: metav1.ObjectMeta{Name: slotShape}, Spec: gpuaas.GpuShapeSpec{
			Requests:  []gpuaas.ShapeRequest{{Name: "gpu", Profile: name}, {Name: "nic", DeviceClassName: nicClass.Name}},
			Alignment: gpuaas.AlignPCIeRoot}},
	} {
		createObject(t, s)
		waitForShape(t, s.Name, "observed", func(s *gpuaas.GpuShape) bool { return s.Status.ObservedGeneration > 0 })
	}
	gpu := func(req string, count int64) resourceapi.DeviceRequest {
		return resourceapi.DeviceRequest{Name: req, Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: name,
			AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: count}}
	}
	nic := func(req string) resourceapi.DeviceRequest {
		return resourceapi.DeviceRequest{Name: req, Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: nicClass.Name,
			AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1}}
	}
	onNUMA := resourceapi.DeviceConstraint{MatchAttribute: ptr.To[resourceapi.FullyQualifiedName]("resource.kubernetes.io/numaNode")}
	onRoot := resourceapi.DeviceConstraint{MatchAttribute: ptr.To[resourceapi.FullyQualifiedName]("resource.kubernetes.io/pcieRoot")}
	claimOf := func(claimName string, reqs []resourceapi.DeviceRequest, cs ...resourceapi.DeviceConstraint) *resourceapi.ResourceClaim {
		return &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: claimName},
			Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: reqs, Constraints: cs}}}
	}
	create := func(c *resourceapi.ResourceClaim) error {
		_, err := tenant.Client.ResourceV1().ResourceClaims(ns).Create(ctx, c, metav1.CreateOptions{})
		return err
	}
	for _, tc := range []struct {
		claim *resourceapi.ResourceClaim
		shape string
	}{
		{claimOf("lease", []resourceapi.DeviceRequest{{Name: "gpus", FirstAvailable: []resourceapi.DeviceSubRequest{
			{Name: "all", DeviceClassName: name, AllocationMode: resourceapi.DeviceAllocationModeAll}}}}), nodeShape},
		{claimOf("pair-twice", []resourceapi.DeviceRequest{gpu("gpus", 2)}, onNUMA, onNUMA), pairShape},
		{claimOf("pair-split", []resourceapi.DeviceRequest{gpu("a", 1), gpu("b", 1)}, onNUMA), pairShape},
		{claimOf("two-slots", []resourceapi.DeviceRequest{gpu("gpu-1", 1), nic("nic-1"), gpu("gpu-2", 1), nic("nic-2")}, onRoot), slotShape},
	} {
		mustDeny(t, create(tc.claim), fmt.Sprintf("instances of shape %q", tc.shape))
	}
	if err := create(claimOf("one-slot", []resourceapi.DeviceRequest{gpu("gpu", 1), nic("nic")}, onRoot)); err != nil {
		t.Fatalf("one slot refused under its limit of 1: %v", err)
	}
	rc.alive(t)
}
