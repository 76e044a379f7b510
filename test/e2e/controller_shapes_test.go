package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

// e2eNICDriver is another vendor's driver, whose NIC slices the test
// publishes itself.
const e2eNICDriver = "nic.e2e.example.com"

// TestControllerShapes: a GpuShape of a GPU and another driver's NIC on one
// PCIe root becomes a ResourceClaimTemplate in each namespace of its
// tenant, stable across resyncs (the API server's defaults do not make it
// look edited); a deleted template comes back; placeable follows the
// published devices and an allocation; a namespace the tenant drops loses
// its template; a missing NIC class is named in the Ready condition.
func TestControllerShapes(t *testing.T) {
	rc := startController(t)
	ctx := framework.Context(t, 4*time.Minute)
	name := uniqueName("slot")
	product, nicClass := shapeParts(t, name, fmt.Sprintf("device.driver == %q", e2eNICDriver))
	ns1, ns2 := cp.CreateNamespace(t, "shape"), cp.CreateNamespace(t, "shape")
	createObject(t, quotaFor(name, []string{ns1, ns2}, gpuaas.QuotaLimits{}))
	createObject(t, &gpuaas.GpuShape{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: gpuaas.GpuShapeSpec{
			Requests:  []gpuaas.ShapeRequest{{Name: "gpu", Profile: name}, {Name: "nic", DeviceClassName: nicClass.Name}},
			Alignment: gpuaas.AlignPCIeRoot,
			Tenants:   []string{name},
		},
	})

	s := waitForShape(t, name, "ready with 2 templates", func(s *gpuaas.GpuShape) bool {
		c := findCondition(s.Status.Conditions, gpuaas.ConditionReady)
		return c != nil && c.Status == metav1.ConditionTrue && s.Status.Templates == 2
	})
	if s.Status.Placeable != 0 {
		t.Fatalf("placeable %d before any device of the profile is published", s.Status.Placeable)
	}
	first := getTemplate(t, ctx, ns1, name)
	if first == nil || len(first.Spec.Spec.Devices.Constraints) != 1 {
		t.Fatalf("template in %s: %+v", ns1, first)
	}
	// Two resyncs later it is the same object: not replaced for looking
	// edited.
	time.Sleep(11 * time.Second)
	if again := getTemplate(t, ctx, ns1, name); again == nil || again.UID != first.UID {
		t.Fatalf("template in %s replaced without an edit", ns1)
	}
	if err := cp.Client.ResourceV1().ResourceClaimTemplates(ns1).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitForTemplate(t, ctx, ns1, name, "re-created", func(tpl *resourceapi.ResourceClaimTemplate) bool {
		return tpl != nil && tpl.UID != first.UID
	})

	// A node with GPUs on roots r0 and r1, and one NIC on r0.
	node := name + "-node"
	gpus := []resourceapi.Device{e2eShapeGPU("gpu-0", product, "pci0000:00"), e2eShapeGPU("gpu-1", product, "pci0000:80")}
	nics := []resourceapi.Device{{Name: "nic-0", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
		"resource.kubernetes.io/pcieRoot": {StringValue: ptr.To("pci0000:00")}}}}
	createObject(t, e2eSlice(name+"-gpus", "gpu.gpuaas.io", node, gpus))
	createObject(t, e2eSlice(name+"-nics", e2eNICDriver, node, nics))
	waitForShape(t, name, "placeable 1", func(s *gpuaas.GpuShape) bool {
		return s.Status.Placeable == 1 && strings.HasSuffix(s.Status.PlaceableMessage, "nodes have a free GPU+NIC on one PCIe root")
	})

	// The GPU of r0 allocated: no aligned pair left.
	claim := gpuClaim(ns1, "taken", name, 1)
	if err := createClaim(ctx, claim); err != nil {
		t.Fatal(err)
	}
	onConflictRetry(t, "allocating the claim", func() error {
		c, err := cp.Client.ResourceV1().ResourceClaims(ns1).Get(ctx, "taken", metav1.GetOptions{})
		if err != nil {
			return err
		}
		c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{
			Request: c.Spec.Devices.Requests[0].Name, Driver: "gpu.gpuaas.io", Pool: node, Device: "gpu-0"}}}}
		_, err = cp.Client.ResourceV1().ResourceClaims(ns1).UpdateStatus(ctx, c, metav1.UpdateOptions{})
		return err
	})
	waitForShape(t, name, "placeable 0 with the GPU of r0 taken", func(s *gpuaas.GpuShape) bool { return s.Status.Placeable == 0 })

	updateObject(t, ctx, &gpuaas.TenantQuota{ObjectMeta: metav1.ObjectMeta{Name: name}}, func(q *gpuaas.TenantQuota) {
		q.Spec.Namespaces = []string{ns1}
	})
	waitForTemplate(t, ctx, ns2, name, "removed from the namespace the tenant dropped", func(tpl *resourceapi.ResourceClaimTemplate) bool { return tpl == nil })

	if err := cp.Client.ResourceV1().DeviceClasses().Delete(ctx, nicClass.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitForShape(t, name, "naming the missing NIC class", func(s *gpuaas.GpuShape) bool {
		c := findCondition(s.Status.Conditions, gpuaas.ConditionReady)
		return c != nil && c.Reason == gpuaas.ReasonPartsMissing &&
			c.Message == fmt.Sprintf("request nic: DeviceClass %q does not exist", nicClass.Name)
	})
	rc.alive(t)
}

// TestControllerShapeRefuse: a shape with whenUnavailable Refuse and
// nothing placeable has the webhook refuse a claim made from its template
// (the template's spec as the API server stored it), with issue 38's
// message; once a GPU and a NIC on one root are published, the same claim
// is admitted, and a second one, which the scheduler could not place
// either, is refused again once the first holds the pair.
func TestControllerShapeRefuse(t *testing.T) {
	rc := startController(t)
	ctx := framework.Context(t, 3*time.Minute)
	name := uniqueName("refuse")
	product, nicClass := shapeParts(t, name, fmt.Sprintf("device.driver == %q && device.attributes[%q].product == %q", e2eNICDriver, e2eNICDriver, name))
	ns := cp.CreateNamespace(t, "refuse")
	createObject(t, quotaFor(name, []string{ns}, gpuaas.QuotaLimits{}))
	createObject(t, &gpuaas.GpuShape{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: gpuaas.GpuShapeSpec{
			Requests:        []gpuaas.ShapeRequest{{Name: "gpu", Profile: name}, {Name: "nic", DeviceClassName: nicClass.Name}},
			Alignment:       gpuaas.AlignPCIeRoot,
			Tenants:         []string{name},
			WhenUnavailable: gpuaas.Refuse,
		},
	})
	waitForShape(t, name, "counted with its template", func(s *gpuaas.GpuShape) bool {
		return s.Status.ObservedGeneration > 0 && s.Status.Templates == 1
	})
	tpl := getTemplate(t, ctx, ns, name)
	fromTemplate := func(claimName string) *resourceapi.ResourceClaim {
		return &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: claimName}, Spec: tpl.Spec.Spec}
	}
	err := createClaim(ctx, fromTemplate("first"))
	mustDeny(t, err, fmt.Sprintf("unavailable: shape %s has 0 placeable (0 of ", name), "nodes have a free GPU+NIC on one PCIe root)")
	t.Logf("refused: %v", err)

	node := name + "-node"
	createObject(t, e2eSlice(name+"-gpus", "gpu.gpuaas.io", node, []resourceapi.Device{e2eShapeGPU("gpu-0", product, "pci0000:00")}))
	createObject(t, e2eSlice(name+"-nics", e2eNICDriver, node, []resourceapi.Device{{Name: "nic-0", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
		"product":                         {StringValue: ptr.To(name)},
		"resource.kubernetes.io/pcieRoot": {StringValue: ptr.To("pci0000:00")}}}}))
	waitForShape(t, name, "placeable 1", func(s *gpuaas.GpuShape) bool { return s.Status.Placeable == 1 })
	if err := createClaim(ctx, fromTemplate("first")); err != nil {
		t.Fatalf("claim refused with one placeable: %v", err)
	}
	// The scheduler's part, done by hand: the pair allocated to it.
	onConflictRetry(t, "allocating the claim", func() error {
		c, err := cp.Client.ResourceV1().ResourceClaims(ns).Get(ctx, "first", metav1.GetOptions{})
		if err != nil {
			return err
		}
		c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{
			{Request: "gpu", Driver: "gpu.gpuaas.io", Pool: node, Device: "gpu-0"},
			{Request: "nic", Driver: e2eNICDriver, Pool: node, Device: "nic-0"}}}}
		_, err = cp.Client.ResourceV1().ResourceClaims(ns).UpdateStatus(ctx, c, metav1.UpdateOptions{})
		return err
	})
	waitForShape(t, name, "placeable 0 again", func(s *gpuaas.GpuShape) bool { return s.Status.Placeable == 0 })
	mustDeny(t, createClaim(ctx, fromTemplate("second")), fmt.Sprintf("unavailable: shape %s has 0 placeable (0 of ", name))
	rc.alive(t)
}

// shapeParts makes a shape test's parts: the GpuProfile name of GPUs
// whose product it returns (ready), and the NIC DeviceClass name-nic of
// the given selector.
func shapeParts(t *testing.T, name, nicSelector string) (string, *resourceapi.DeviceClass) {
	t.Helper()
	product := "E2E Shape GPU " + name
	createObject(t, profile(name, gpuaas.ProfileSelector{Type: gpuaas.DeviceTypeGPU, ProductName: product}))
	waitForProfileReady(t, name)
	nic := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: name + "-nic"},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: nicSelector}}}}}
	createObject(t, nic)
	return product, nic
}

func e2eShapeGPU(name, product, root string) resourceapi.Device {
	return resourceapi.Device{Name: name, Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
		"type":                            {StringValue: ptr.To("gpu")},
		"productName":                     {StringValue: ptr.To(product)},
		"resource.kubernetes.io/pcieRoot": {StringValue: ptr.To(root)},
	}}
}

func e2eSlice(name, driver, node string, devs []resourceapi.Device) *resourceapi.ResourceSlice {
	return &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourceapi.ResourceSliceSpec{
			Driver: driver, NodeName: ptr.To(node),
			Pool:    resourceapi.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: 1},
			Devices: devs,
		},
	}
}

func waitForShape(t testing.TB, name, what string, cond func(*gpuaas.GpuShape) bool) *gpuaas.GpuShape {
	t.Helper()
	ctx := framework.Context(t, time.Minute)
	var s gpuaas.GpuShape
	err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		if err := ctrlClient.Get(ctx, types.NamespacedName{Name: name}, &s); err != nil {
			return false, client.IgnoreNotFound(err)
		}
		return cond(&s), nil
	})
	if err != nil {
		t.Fatalf("GpuShape %s not %s: %v; status %+v", name, what, err, s.Status)
	}
	return &s
}

func getTemplate(t testing.TB, ctx context.Context, ns, name string) *resourceapi.ResourceClaimTemplate {
	t.Helper()
	tpl, err := cp.Client.ResourceV1().ResourceClaimTemplates(ns).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return tpl
}

func waitForTemplate(t testing.TB, ctx context.Context, ns, name, what string, cond func(*resourceapi.ResourceClaimTemplate) bool) {
	t.Helper()
	err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		return cond(getTemplate(t, ctx, ns, name)), nil
	})
	if err != nil {
		t.Fatalf("ResourceClaimTemplate %s/%s not %s: %v", ns, name, what, err)
	}
}
