package quota

import (
	"math/big"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/gpuaas/gpu-dra-driver/pkg/deviceweight"
)

// Attribute and capacity names the kubelet plugin publishes, and device
// types: pkg/deviceweight's, where a device's weight is read.
const (
	AttrType               = deviceweight.AttrType
	AttrProfile            = deviceweight.AttrProfile
	AttrComputeSlices      = deviceweight.AttrComputeSlices
	AttrTotalComputeSlices = deviceweight.AttrTotalComputeSlices
	AttrReplicas           = deviceweight.AttrReplicas
	CapacityMemory         = deviceweight.CapacityMemory

	TypeGPU       = deviceweight.TypeGPU
	TypeMIG       = deviceweight.TypeMIG
	TypeTimeSlice = deviceweight.TypeTimeSlice
	TypeShared    = deviceweight.TypeShared
)

// deviceUnits is the weight of a whole device in exact units, and how it
// was found (deviceweight.Whole).
func deviceUnits(d *resourceapi.Device, driver string) (Units, string) {
	f, how := deviceweight.Whole(d, driver)
	return NewUnits(f.Num, f.Den), how
}

func stringAttr(d *resourceapi.Device, driver, name string) string {
	return deviceweight.String(d, driver, name)
}

func capacity(d *resourceapi.Device, driver, name string) (resourceapi.DeviceCapacity, bool) {
	return deviceweight.Capacity(d, driver, name)
}

func capacityBytes(d *resourceapi.Device, driver, name string) int64 {
	return deviceweight.CapacityBytes(d, driver, name)
}

// quantityIn looks a name up in a capacity map keyed by qualified names.
func quantityIn(m map[resourceapi.QualifiedName]resource.Quantity, driver, name string) (resource.Quantity, bool) {
	if q, ok := m[resourceapi.QualifiedName(name)]; ok {
		return q, true
	}
	q, ok := m[resourceapi.QualifiedName(driver+"/"+name)]
	return q, ok
}

// shareUnits is the weight of memory bytes of a shared device: the share of
// its memory, exact.
func shareUnits(memory, capacity int64) Units {
	if capacity <= 0 {
		return WholeUnits(1)
	}
	return Units{r: new(big.Rat).SetFrac(big.NewInt(memory), big.NewInt(capacity))}
}
