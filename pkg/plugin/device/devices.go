// Package device is what each kind of device the plugin publishes does:
// a whole GPU, a static or dynamic MIG device, a time-slice replica and a
// memory share, each one type behind Kind, from the claim's plan to its
// teardown, and the GPU sharing settings those kinds hold. It knows
// nothing of the kubelet, of publishing, or of how a claim is locked and
// recorded: the prepare plane calls the kinds with an Env.
package device

import (
	"fmt"

	"strconv"
	"strings"

	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/mig"

	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
	"github.com/gpuaas/gpu-dra-driver/pkg/timeslice"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/utils/ptr"
)

// DeviceType is the value of the `type` attribute.
type DeviceType string

const (
	TypeGPU DeviceType = "gpu"
	TypeMIG DeviceType = mig.TypeMig
	// TypeTimeSlice is one of N replicas of a time-sliced GPU.
	TypeTimeSlice DeviceType = timeslice.TypeTimeSlice
	// TypeShared is a shared GPU's multi-allocatable device.
	TypeShared DeviceType = timeslice.TypeShared
)

// AllocatableDevice is one device the plugin publishes and can prepare.
type AllocatableDevice struct {
	// GPU is the physical GPU the device lives on; its UUID is the lock key.
	GPU nvdev.GPU
	// API is the device as published in the ResourceSlice.
	API resourceapi.Device
	// kind is how the device maps onto its GPU, and what preparing it
	// does (kinds.go).
	Kind Kind
}

// Type says how the device maps onto its GPU.
func (d *AllocatableDevice) Type() DeviceType { return d.Kind.Type() }

// MultiAllocatable reports whether several claims may hold the device.
func (d *AllocatableDevice) MultiAllocatable() bool {
	return d.API.AllowMultipleAllocations != nil && *d.API.AllowMultipleAllocations
}

// OnDynamicMIG reports whether the device is of a dynamic-MIG GPU: one of
// its MIG devices, or the GPU whole.
func (d *AllocatableDevice) OnDynamicMIG() bool {
	return d.Kind.ModeName() == string(configapi.MigDynamic)
}

// Partition is the MIG device prepare creates; nil but for dynamic MIG.
func (d *AllocatableDevice) Partition() *mig.Partition {
	if k, ok := d.Kind.(dynamicMIG); ok {
		return k.part
	}
	return nil
}

// StaticInstance is the existing MIG device; nil but for static MIG.
func (d *AllocatableDevice) StaticInstance() *mig.Instance {
	if k, ok := d.Kind.(staticMIG); ok {
		return k.inst
	}
	return nil
}

// Name is the device's name in its pool.
func (d *AllocatableDevice) Name() string { return d.API.Name }

// GPUDeviceName is the stable name of a whole GPU: its NVML index, which
// follows PCI bus order and so survives restarts and MIG mode changes (the
// minor number may not).
func GPUDeviceName(index int) string { return fmt.Sprintf("gpu-%d", index) }

// WholeGPUDevice describes one GPU offered whole.
func WholeGPUDevice(gpu nvdev.GPU, sys nvdev.SystemInfo) AllocatableDevice {
	attrs := GPUAttributes(gpu, sys)
	attrs["type"] = StringAttr(string(TypeGPU))
	return AllocatableDevice{
		GPU:  gpu,
		Kind: wholeGPU{},
		API: resourceapi.Device{
			Name:       GPUDeviceName(gpu.Index),
			Attributes: attrs,
			Capacity:   gpuCapacity(gpu),
		},
	}
}

// GPUAttributes are the attributes every device on a GPU carries, whatever
// slice of it is offered.
func GPUAttributes(gpu nvdev.GPU, sys nvdev.SystemInfo) map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
	attrs := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
		"uuid":                  StringAttr(gpu.UUID),
		"productName":           StringAttr(gpu.ProductName),
		"brand":                 StringAttr(gpu.Brand),
		"architecture":          StringAttr(gpu.Architecture),
		"cudaComputeCapability": VersionAttr(gpu.CUDAComputeCapability),
		"driverVersion":         VersionAttr(sys.DriverVersion),
		"cudaDriverVersion":     VersionAttr(sys.CUDADriverVersion),
		"index":                 {IntValue: ptr.To(int64(gpu.Index))},
		"minor":                 {IntValue: ptr.To(int64(gpu.Minor))},
		"migCapable":            {BoolValue: ptr.To(gpu.MigCapable)},
		deviceattribute.StandardDeviceAttributePCIBusID: StringAttr(gpu.PCIBusID),
	}
	if gpu.PCIeRoot != "" {
		attrs[deviceattribute.StandardDeviceAttributePCIeRoot] = StringAttr(gpu.PCIeRoot)
	}
	// Kubernetes: "devices with no NUMA affinity must not publish" numaNode.
	if gpu.NUMANode >= 0 {
		attrs[deviceattribute.StandardDeviceAttributeNUMANode] = resourceapi.DeviceAttribute{IntValue: ptr.To(int64(gpu.NUMANode))}
	}
	return attrs
}

func gpuCapacity(gpu nvdev.GPU) map[resourceapi.QualifiedName]resourceapi.DeviceCapacity {
	c := map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
		"memory": {Value: *resource.NewQuantity(int64(gpu.MemoryBytes), resource.BinarySI)},
	}
	if gpu.Multiprocessors > 0 {
		c["multiprocessors"] = resourceapi.DeviceCapacity{Value: *resource.NewQuantity(int64(gpu.Multiprocessors), resource.DecimalSI)}
	}
	return c
}

func StringAttr(s string) resourceapi.DeviceAttribute {
	return resourceapi.DeviceAttribute{StringValue: ptr.To(s)}
}

func VersionAttr(v string) resourceapi.DeviceAttribute {
	return resourceapi.DeviceAttribute{VersionValue: ptr.To(semver(v))}
}

// semver turns NVIDIA's versions ("9.0", "12.4", "535.104.05") into the
// semantic versions the API requires ("9.0.0", "12.4.0", "535.104.5"), so
// CEL can compare them with semver().
func semver(v string) string {
	parts := strings.SplitN(v, ".", 3)
	for len(parts) < 3 {
		parts = append(parts, "0")
	}
	for i, p := range parts {
		if n, err := strconv.Atoi(p); err == nil {
			parts[i] = strconv.Itoa(n)
		}
	}
	return strings.Join(parts, ".")
}
