// Package testworld holds the fixtures the controller's packages test
// against: a small GPU catalog (profiles, classes, slices), tenants, claims
// and a fake client indexed as the manager's cache is.
package testworld

import (
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller/catalog"
	"github.com/gpuaas/gpu-dra-driver/pkg/deviceclass"
)

// Fixtures: a node with 4 whole H100s and, on a second node, 7 MIG 1g
// devices of one H100, following the plugin's device model.

// Driver is the DRA Driver the fixtures publish for.
const Driver = "gpu.gpuaas.io"

func Attr(s string) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{StringValue: &s} }
func IntAttr(n int64) resourceapi.DeviceAttribute {
	return resourceapi.DeviceAttribute{IntValue: &n}
}

func WholeGPU(i int) resourceapi.Device {
	return resourceapi.Device{
		Name: fmt.Sprintf("gpu-%d", i),
		Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			"type": Attr("gpu"), "productName": Attr("NVIDIA H100 80GB HBM3"), "architecture": Attr("Hopper"),
		},
		Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{"memory": {Value: resource.MustParse("80Gi")}},
	}
}

func Mig1g(i int) resourceapi.Device {
	return resourceapi.Device{
		Name: fmt.Sprintf("gpu-0-mig-1g-%d", i),
		Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			"type": Attr("mig"), "productName": Attr("NVIDIA H100 80GB HBM3"), "profile": Attr("1g.10gb"),
			"computeSlices": IntAttr(1), "totalComputeSlices": IntAttr(7),
		},
		Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{"memory": {Value: resource.MustParse("10Gi")}},
	}
}

func ResourceSlice(node string, devices ...resourceapi.Device) *resourceapi.ResourceSlice {
	return &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: node + "-slice"},
		Spec: resourceapi.ResourceSliceSpec{
			Driver: Driver, NodeName: ptr.To(node),
			Pool:    resourceapi.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: 1},
			Devices: devices,
		},
	}
}

func GpuProfile(name string, sel gpuaas.ProfileSelector) *gpuaas.GpuProfile {
	return &gpuaas.GpuProfile{
		ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name), Generation: 1},
		Spec:       gpuaas.GpuProfileSpec{Selector: sel},
	}
}

// ClassOf renders a profile's class, as the controller would have.
func ClassOf(t testing.TB, p *gpuaas.GpuProfile) *resourceapi.DeviceClass {
	t.Helper()
	dc, err := deviceclass.Build(p, nil)
	if err != nil {
		t.Fatal(err)
	}
	return dc
}

func TenantQuota(name string, created int, spec gpuaas.TenantQuotaSpec) *gpuaas.TenantQuota {
	return &gpuaas.TenantQuota{
		ObjectMeta: metav1.ObjectMeta{Name: name, Generation: 1, CreationTimestamp: metav1.NewTime(time.Unix(int64(1000+created), 0))},
		Spec:       spec,
	}
}

// TeamQuota is a quota of units GPU units over one namespace.
func TeamQuota(name, namespace, units string) *gpuaas.TenantQuota {
	return TenantQuota(name, 0, gpuaas.TenantQuotaSpec{Namespaces: []string{namespace}, Limits: gpuaas.QuotaLimits{GpuUnits: Qty(units)}})
}

func Qty(s string) *resource.Quantity { return ptr.To(resource.MustParse(s)) }

func Namespace(name string, labels map[string]string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
}

// claimSeq numbers the claims' UIDs.
var claimSeq int

func Claim(namespace, name, class string, count int64) *resourceapi.ResourceClaim {
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

func AllocatedTo(c *resourceapi.ResourceClaim, pool string, devices ...string) *resourceapi.ResourceClaim {
	c.Status.Allocation = &resourceapi.AllocationResult{}
	for _, d := range devices {
		c.Status.Allocation.Devices.Results = append(c.Status.Allocation.Devices.Results, resourceapi.DeviceRequestAllocationResult{
			Request: "gpu", Driver: Driver, Pool: pool, Device: d,
		})
	}
	return c
}

func OwnedByPod(c *resourceapi.ResourceClaim, pod string) *resourceapi.ResourceClaim {
	c.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: pod, UID: "pod-uid", Controller: ptr.To(true)}}
	return c
}

// World is the catalog every controller test starts from: profiles h100
// and mig-1g with their classes, 4 whole GPUs on node-a and 7 1g slices on
// node-b.
func World(t testing.TB) []client.Object {
	h100 := GpuProfile("h100", gpuaas.ProfileSelector{Type: "gpu"})
	mig := GpuProfile("mig-1g", gpuaas.ProfileSelector{MigProfile: "1g.10gb"})
	objs := []client.Object{
		h100, mig, ClassOf(t, h100), ClassOf(t, mig),
		ResourceSlice("node-a", WholeGPU(0), WholeGPU(1), WholeGPU(2), WholeGPU(3)),
	}
	var migs []resourceapi.Device
	for i := range 7 {
		migs = append(migs, Mig1g(i))
	}
	return append(objs, ResourceSlice("node-b", migs...))
}

func NewFakeClient(t testing.TB, objs ...client.Object) client.WithWatch {
	t.Helper()
	s, err := Scheme()
	if err != nil {
		t.Fatal(err)
	}
	return fake.NewClientBuilder().WithScheme(s).WithObjects(objs...).
		WithIndex(&resourceapi.ResourceClaim{}, catalog.IndexClaimClasses, catalog.ClaimClasses).
		WithStatusSubresource(&gpuaas.GpuProfile{}, &gpuaas.TenantQuota{}, &gpuaas.GpuShape{}).
		WithGlobalResourceVersionCounter(). // comparable, as etcd's are
		Build()
}

// Scheme knows the built-in types and ours, as the controller's.
func Scheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		return nil, fmt.Errorf("adding built-in types: %w", err)
	}
	if err := gpuaas.AddToScheme(s); err != nil {
		return nil, fmt.Errorf("adding gpuaas.io types: %w", err)
	}
	return s, nil
}

// WithAlternatives is a claim of one request whose firstAvailable
// alternatives are one device of each class, named "alt-<class>".
func WithAlternatives(namespace, name string, classes ...string) *resourceapi.ResourceClaim {
	c := Claim(namespace, name, "", 0)
	r := &c.Spec.Devices.Requests[0]
	r.Exactly = nil
	for _, class := range classes {
		r.FirstAvailable = append(r.FirstAvailable, resourceapi.DeviceSubRequest{
			Name: "alt-" + class, DeviceClassName: class, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1,
		})
	}
	return c
}

// GenericClass selects every device of the driver, as a catch-all class
// an admin might add beside the catalog.
func GenericClass() *resourceapi.DeviceClass {
	return &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "any-gpu"},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
			Expression: `device.driver == "gpu.gpuaas.io"`}}}}}
}
