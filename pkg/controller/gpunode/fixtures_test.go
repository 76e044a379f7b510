package gpunode

import (
	"context"
	"fmt"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
)

// Fixtures, as pkg/controller's tests have them: slices and claims of our
// driver, following the plugin's device model.

const driver = "gpu.gpuaas.io"

func attr(s string) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{StringValue: &s} }
func intAttr(n int64) resourceapi.DeviceAttribute {
	return resourceapi.DeviceAttribute{IntValue: &n}
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

// testScheme knows the built-in types and ours, as the controller's.
func testScheme(t *testing.T) *runtime.Scheme {
	t.Helper()
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	if err := gpuaas.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	return s
}

func ctx(t testing.TB) context.Context { return t.Context() }
