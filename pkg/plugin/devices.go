// Package plugin is the node side of the driver: it turns the node's GPUs
// into published devices, prepares allocated devices for containers (CDI
// specs, checkpoint) and undoes that on unprepare, under per-GPU locks.
package plugin

import (
	"fmt"

	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/mig"
	"strconv"
	"strings"

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
	kind deviceKind
}

// Type says how the device maps onto its GPU.
func (d *AllocatableDevice) Type() DeviceType { return d.kind.Type() }

// multiAllocatable reports whether several claims may hold the device.
func (d *AllocatableDevice) multiAllocatable() bool {
	return d.API.AllowMultipleAllocations != nil && *d.API.AllowMultipleAllocations
}

// onDynamicMIG reports whether the device is of a dynamic-MIG GPU: one of
// its MIG devices, or the GPU whole.
func (d *AllocatableDevice) onDynamicMIG() bool {
	return d.kind.modeName() == string(configapi.MigDynamic)
}

// Partition is the MIG device prepare creates; nil but for dynamic MIG.
func (d *AllocatableDevice) Partition() *mig.Partition {
	if k, ok := d.kind.(dynamicMIG); ok {
		return k.part
	}
	return nil
}

// staticInstance is the existing MIG device; nil but for static MIG.
func (d *AllocatableDevice) staticInstance() *mig.Instance {
	if k, ok := d.kind.(staticMIG); ok {
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
	attrs := gpuAttributes(gpu, sys)
	attrs["type"] = stringAttr(string(TypeGPU))
	return AllocatableDevice{
		GPU:  gpu,
		kind: wholeGPU{},
		API: resourceapi.Device{
			Name:       GPUDeviceName(gpu.Index),
			Attributes: attrs,
			Capacity:   gpuCapacity(gpu),
		},
	}
}

// gpuAttributes are the attributes every device on a GPU carries, whatever
// slice of it is offered.
func gpuAttributes(gpu nvdev.GPU, sys nvdev.SystemInfo) map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
	attrs := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
		"uuid":                  stringAttr(gpu.UUID),
		"productName":           stringAttr(gpu.ProductName),
		"brand":                 stringAttr(gpu.Brand),
		"architecture":          stringAttr(gpu.Architecture),
		"cudaComputeCapability": versionAttr(gpu.CUDAComputeCapability),
		"driverVersion":         versionAttr(sys.DriverVersion),
		"cudaDriverVersion":     versionAttr(sys.CUDADriverVersion),
		"index":                 {IntValue: ptr.To(int64(gpu.Index))},
		"minor":                 {IntValue: ptr.To(int64(gpu.Minor))},
		"migCapable":            {BoolValue: ptr.To(gpu.MigCapable)},
		deviceattribute.StandardDeviceAttributePCIBusID: stringAttr(gpu.PCIBusID),
	}
	if gpu.PCIeRoot != "" {
		attrs[deviceattribute.StandardDeviceAttributePCIeRoot] = stringAttr(gpu.PCIeRoot)
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

func stringAttr(s string) resourceapi.DeviceAttribute {
	return resourceapi.DeviceAttribute{StringValue: ptr.To(s)}
}

func versionAttr(v string) resourceapi.DeviceAttribute {
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
