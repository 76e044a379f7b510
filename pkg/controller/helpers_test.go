package controller

import (
	"context"
	"fmt"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/deviceclass"
	"github.com/gpuaas/gpu-dra-driver/pkg/quota"
)

// Fixtures: a node with 4 whole H100s and, on a second node, 7 MIG 1g
// devices of one H100, following the plugin's device model.

const driver = "gpu.gpuaas.io"

func attr(s string) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{StringValue: &s} }
func intAttr(n int64) resourceapi.DeviceAttribute {
	return resourceapi.DeviceAttribute{IntValue: &n}
}

func wholeGPU(i int) resourceapi.Device {
	return resourceapi.Device{
		Name: fmt.Sprintf("gpu-%d", i),
		Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			"type": attr("gpu"), "productName": attr("NVIDIA H100 80GB HBM3"), "architecture": attr("Hopper"),
		},
		Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{"memory": {Value: resource.MustParse("80Gi")}},
	}
}

func mig1g(i int) resourceapi.Device {
	return resourceapi.Device{
		Name: fmt.Sprintf("gpu-0-mig-1g-%d", i),
		Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			"type": attr("mig"), "productName": attr("NVIDIA H100 80GB HBM3"), "profile": attr("1g.10gb"),
			"computeSlices": intAttr(1), "totalComputeSlices": intAttr(7),
		},
		Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{"memory": {Value: resource.MustParse("10Gi")}},
	}
}

func resourceSlice(node string, devices ...resourceapi.Device) *resourceapi.ResourceSlice {
	return &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: node + "-slice"},
		Spec: resourceapi.ResourceSliceSpec{
			Driver: driver, NodeName: ptr.To(node),
			Pool:    resourceapi.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: 1},
			Devices: devices,
		},
	}
}

func gpuProfile(name string, sel gpuaas.ProfileSelector) *gpuaas.GpuProfile {
	return &gpuaas.GpuProfile{
		ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name), Generation: 1},
		Spec:       gpuaas.GpuProfileSpec{Selector: sel},
	}
}

// classOf renders a profile's class, as the controller would have.
func classOf(t testing.TB, p *gpuaas.GpuProfile) *resourceapi.DeviceClass {
	t.Helper()
	dc, err := deviceclass.Build(p, nil)
	if err != nil {
		t.Fatal(err)
	}
	return dc
}

func tenantQuota(name string, created int, spec gpuaas.TenantQuotaSpec) *gpuaas.TenantQuota {
	return &gpuaas.TenantQuota{
		ObjectMeta: metav1.ObjectMeta{Name: name, Generation: 1, CreationTimestamp: metav1.NewTime(time.Unix(int64(1000+created), 0))},
		Spec:       spec,
	}
}

func qty(s string) *resource.Quantity { return ptr.To(resource.MustParse(s)) }

func ns(name string, labels map[string]string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
}

var claimSeq int

func claim(namespace, name, class string, count int64) *resourceapi.ResourceClaim {
	claimSeq++
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, UID: types.UID(fmt.Sprintf("claim-uid-%d", claimSeq))},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{
				DeviceClassName: class, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: count,
			},
		}}}},
	}
}

func allocatedTo(c *resourceapi.ResourceClaim, pool string, devices ...string) *resourceapi.ResourceClaim {
	c.Status.Allocation = &resourceapi.AllocationResult{}
	for _, d := range devices {
		c.Status.Allocation.Devices.Results = append(c.Status.Allocation.Devices.Results, resourceapi.DeviceRequestAllocationResult{
			Request: "gpu", Driver: driver, Pool: pool, Device: d,
		})
	}
	return c
}

func ownedByPod(c *resourceapi.ResourceClaim, pod string) *resourceapi.ResourceClaim {
	c.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: pod, UID: "pod-uid", Controller: ptr.To(true)}}
	return c
}

// world is the catalog every controller test starts from: profiles h100
// and mig-1g with their classes, 4 whole GPUs on node-a and 7 1g slices on
// node-b.
func world(t testing.TB) []client.Object {
	h100 := gpuProfile("h100", gpuaas.ProfileSelector{Type: "gpu"})
	mig := gpuProfile("mig-1g", gpuaas.ProfileSelector{MigProfile: "1g.10gb"})
	objs := []client.Object{
		h100, mig, classOf(t, h100), classOf(t, mig),
		resourceSlice("node-a", wholeGPU(0), wholeGPU(1), wholeGPU(2), wholeGPU(3)),
	}
	var migs []resourceapi.Device
	for i := range 7 {
		migs = append(migs, mig1g(i))
	}
	return append(objs, resourceSlice("node-b", migs...))
}

func newFakeClient(t testing.TB, objs ...client.Object) client.WithWatch {
	t.Helper()
	s, err := Scheme()
	if err != nil {
		t.Fatal(err)
	}
	return fake.NewClientBuilder().WithScheme(s).WithObjects(objs...).
		WithIndex(&resourceapi.ResourceClaim{}, indexClaimClasses, claimClasses).
		WithStatusSubresource(&gpuaas.GpuProfile{}, &gpuaas.TenantQuota{}).
		WithGlobalResourceVersionCounter(). // comparable, as etcd's are
		Build()
}

func newAccountant(t testing.TB, objs ...client.Object) (*Accountant, client.WithWatch) {
	c := newFakeClient(t, objs...)
	return NewAccountant(c, c, NewLedger(c, "gpuaas")), c
}

func ctx(t testing.TB) context.Context { return t.Context() }

func quotaUnits(n, d int64) quota.Units { return quota.NewUnits(n, d) }

func counterValue(t *testing.T, tenant string) float64 {
	t.Helper()
	var m dto.Metric
	if err := unitSeconds.WithLabelValues(tenant).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}
