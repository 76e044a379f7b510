package quota

import (
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
)

// Test fixtures follow the device model the kubelet plugin publishes.

const h100 = "NVIDIA H100 80GB HBM3"

func str(s string) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{StringValue: &s} }
func num(n int64) resourceapi.DeviceAttribute  { return resourceapi.DeviceAttribute{IntValue: &n} }

func memCap(q string) map[resourceapi.QualifiedName]resourceapi.DeviceCapacity {
	return map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{CapacityMemory: {Value: resource.MustParse(q)}}
}

func gpuDevice(i int) resourceapi.Device {
	return resourceapi.Device{
		Name: fmt.Sprintf("gpu-%d", i),
		Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			AttrType: str(TypeGPU), "productName": str(h100), "architecture": str("Hopper"), "index": num(int64(i)),
		},
		Capacity: memCap("80Gi"),
	}
}

func migDevice(i int, profile string, slices int64, mem string) resourceapi.Device {
	return resourceapi.Device{
		Name: fmt.Sprintf("gpu-%d-mig-%s", i, profile),
		Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			AttrType: str(TypeMIG), "productName": str(h100), AttrProfile: str(profile),
			AttrComputeSlices: num(slices), AttrTotalComputeSlices: num(7),
		},
		Capacity: memCap(mem),
	}
}

func timesliceDevice(i, replica int, n int64) resourceapi.Device {
	return resourceapi.Device{
		Name: fmt.Sprintf("gpu-%d-ts-%d", i, replica),
		Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			AttrType: str(TypeTimeSlice), AttrReplicas: num(n),
		},
		Capacity: memCap("20Gi"),
	}
}

func sharedDevice(i int, policy *resourceapi.CapacityRequestPolicy) resourceapi.Device {
	return resourceapi.Device{
		Name:                     fmt.Sprintf("gpu-%d-shared", i),
		AllowMultipleAllocations: ptr.To(true),
		Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			AttrType: str(TypeShared), "productName": str(h100),
		},
		Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
			CapacityMemory: {Value: resource.MustParse("80Gi"), RequestPolicy: policy},
		},
	}
}

func slice(driver, pool string, gen int64, devices ...resourceapi.Device) *resourceapi.ResourceSlice {
	return &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%s-%d", pool, driver, gen)},
		Spec: resourceapi.ResourceSliceSpec{
			Driver:   driver,
			Pool:     resourceapi.ResourcePool{Name: pool, Generation: gen, ResourceSliceCount: 1},
			NodeName: ptr.To(pool),
			Devices:  devices,
		},
	}
}

func class(name string, exprs ...string) *resourceapi.DeviceClass {
	dc := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: name}}
	for _, e := range exprs {
		dc.Spec.Selectors = append(dc.Spec.Selectors, resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{Expression: e}})
	}
	return dc
}

const ours = `device.driver == "gpu.gpuaas.io"`

func typeIs(t string) string { return fmt.Sprintf(`device.attributes["gpu.gpuaas.io"].type == %q`, t) }

func profileIs(p string) string {
	return fmt.Sprintf(`device.attributes["gpu.gpuaas.io"].profile == %q`, p)
}

// testClasses is a small catalog.
func testClasses() map[string]*resourceapi.DeviceClass {
	m := map[string]*resourceapi.DeviceClass{}
	for _, c := range []*resourceapi.DeviceClass{
		class("h100", ours, typeIs("gpu")),
		class("mig-1g", ours, profileIs("1g.10gb")),
		class("mig-3g", ours, profileIs("3g.40gb")),
		class("mig-any", ours, typeIs("mig")),
		class("ts", ours, typeIs("timeslice")),
		class("shared", ours, typeIs("shared")),
		class("any", ours),
		class("nic", `device.driver == "nic.example.com"`),
		class("broken", ours, `device.attributes["gpu.gpuaas.io"].noSuchAttr == "x"`),
	} {
		m[c.Name] = c
	}
	return m
}

// testInventory: node-a has 2 whole GPUs; node-b has 1 whole GPU, MIG
// devices (3x 1g.10gb, 1x 3g.40gb), 4 time-slice replicas of one GPU, and
// a shared GPU; a NIC driver publishes on node-a too.
func testInventory() *Inventory {
	step := &resourceapi.CapacityRequestPolicy{
		Default:    ptr.To(resource.MustParse("10Gi")),
		ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: ptr.To(resource.MustParse("5Gi")), Step: ptr.To(resource.MustParse("5Gi"))},
	}
	return NewInventory(DriverName, []*resourceapi.ResourceSlice{
		slice(DriverName, "node-a", 1, gpuDevice(0), gpuDevice(1)),
		slice(DriverName, "node-b", 3, gpuDevice(0),
			migDevice(1, "1g.10gb", 1, "10Gi"), migDevice(2, "1g.10gb", 1, "10Gi"), migDevice(3, "1g.10gb", 1, "10Gi"),
			migDevice(4, "3g.40gb", 3, "40Gi"),
			timesliceDevice(5, 0, 4), timesliceDevice(5, 1, 4), timesliceDevice(5, 2, 4), timesliceDevice(5, 3, 4),
			sharedDevice(6, step)),
		// A leftover slice of an older generation of node-b: ignored.
		slice(DriverName, "node-b", 2, gpuDevice(7)),
		slice("nic.example.com", "node-a", 1, resourceapi.Device{Name: "eth0"}),
	})
}

func testPricer() *Pricer {
	return NewPricer(testInventory(), testClasses(), map[string]bool{"h100": true, "mig-1g": true, "mig-3g": true, "future": true})
}

func exact(name, class string, count int64, mutate ...func(*resourceapi.ExactDeviceRequest)) resourceapi.DeviceRequest {
	r := &resourceapi.ExactDeviceRequest{DeviceClassName: class, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: count}
	for _, m := range mutate {
		m(r)
	}
	return resourceapi.DeviceRequest{Name: name, Exactly: r}
}

func withSelector(expr string) func(*resourceapi.ExactDeviceRequest) {
	return func(r *resourceapi.ExactDeviceRequest) {
		r.Selectors = append(r.Selectors, resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{Expression: expr}})
	}
}

func withMemory(q string) func(*resourceapi.ExactDeviceRequest) {
	return func(r *resourceapi.ExactDeviceRequest) {
		r.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{CapacityMemory: resource.MustParse(q)}}
	}
}

func allMode(r *resourceapi.ExactDeviceRequest) {
	r.AllocationMode, r.Count = resourceapi.DeviceAllocationModeAll, 0
}

func adminAccess(r *resourceapi.ExactDeviceRequest) { r.AdminAccess = ptr.To(true) }

func firstAvailable(name string, subs ...resourceapi.DeviceRequest) resourceapi.DeviceRequest {
	r := resourceapi.DeviceRequest{Name: name}
	for _, s := range subs {
		e := s.Exactly
		r.FirstAvailable = append(r.FirstAvailable, resourceapi.DeviceSubRequest{
			Name: s.Name, DeviceClassName: e.DeviceClassName, Selectors: e.Selectors,
			AllocationMode: e.AllocationMode, Count: e.Count, Capacity: e.Capacity,
		})
	}
	return r
}

func claimSpec(reqs ...resourceapi.DeviceRequest) *resourceapi.ResourceClaimSpec {
	return &resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: reqs}}
}

func gi(n int64) int64 { return n << 30 }

func charge(units Units, mem int64, devices map[string]int64) Charge {
	return Charge{Units: units, Memory: mem, Devices: devices}
}

func tenantQuota(name string, created int, mutate ...func(*gpuaas.TenantQuota)) *gpuaas.TenantQuota {
	q := &gpuaas.TenantQuota{ObjectMeta: metav1.ObjectMeta{
		Name: name, CreationTimestamp: metav1.Unix(int64(1000+created), 0),
	}}
	for _, m := range mutate {
		m(q)
	}
	return q
}
