package quota

import (
	"fmt"
	"math/big"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// Attribute and capacity names the kubelet plugin publishes (unqualified,
// that is, in the driver's domain).
const (
	AttrType               = "type"
	AttrProfile            = "profile"
	AttrComputeSlices      = "computeSlices"
	AttrTotalComputeSlices = "totalComputeSlices"
	AttrReplicas           = "replicas"
	CapacityMemory         = "memory"
)

// Device types.
const (
	TypeGPU       = "gpu"
	TypeMIG       = "mig"
	TypeTimeSlice = "timeslice"
	TypeShared    = "shared"
)

// deviceUnits is the weight of a whole device and how it was found (for
// logs and tests). Whatever cannot be worked out costs a whole GPU: no
// device is worth more, so the guess never undercharges.
func deviceUnits(d *resourceapi.Device, driver string) (Units, string) {
	switch typ := stringAttr(d, driver, AttrType); typ {
	case TypeGPU, TypeShared:
		return WholeUnits(1), typ
	case TypeMIG:
		return migUnits(d, driver)
	case TypeTimeSlice:
		n, ok := intAttr(d, driver, AttrReplicas)
		if !ok || n < 1 {
			return WholeUnits(1), "timeslice without replicas: charged as a whole GPU"
		}
		return NewUnits(1, n), fmt.Sprintf("timeslice 1/%d", n)
	default:
		return WholeUnits(1), fmt.Sprintf("type %q: charged as a whole GPU", typ)
	}
}

// migUnits is computeSlices/totalComputeSlices. Without computeSlices the
// profile name ("3g.40gb") says it; without the total nothing does.
func migUnits(d *resourceapi.Device, driver string) (Units, string) {
	slices, ok := intAttr(d, driver, AttrComputeSlices)
	if !ok {
		slices, ok = profileSlices(stringAttr(d, driver, AttrProfile))
	}
	total, hasTotal := intAttr(d, driver, AttrTotalComputeSlices)
	if !ok || !hasTotal || slices < 1 || total < slices {
		return WholeUnits(1), "mig without slice counts: charged as a whole GPU"
	}
	return NewUnits(slices, total), fmt.Sprintf("mig %d/%d", slices, total)
}

// profileSlices reads the GPU-instance slice count of a MIG profile name:
// "3g.40gb" -> 3, "1c.3g.40gb" -> 3.
func profileSlices(profile string) (int64, bool) {
	parts := strings.Split(profile, ".")
	for _, p := range parts {
		if g, ok := strings.CutSuffix(p, "g"); ok {
			n, err := strconv.ParseInt(g, 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}

// attribute looks a name up unqualified and qualified with the driver.
func attribute(d *resourceapi.Device, driver, name string) (resourceapi.DeviceAttribute, bool) {
	if a, ok := d.Attributes[resourceapi.QualifiedName(name)]; ok {
		return a, true
	}
	a, ok := d.Attributes[resourceapi.QualifiedName(driver+"/"+name)]
	return a, ok
}

func stringAttr(d *resourceapi.Device, driver, name string) string {
	if a, ok := attribute(d, driver, name); ok && a.StringValue != nil {
		return *a.StringValue
	}
	return ""
}

func intAttr(d *resourceapi.Device, driver, name string) (int64, bool) {
	if a, ok := attribute(d, driver, name); ok && a.IntValue != nil {
		return *a.IntValue, true
	}
	return 0, false
}

func capacity(d *resourceapi.Device, driver, name string) (resourceapi.DeviceCapacity, bool) {
	if c, ok := d.Capacity[resourceapi.QualifiedName(name)]; ok {
		return c, true
	}
	c, ok := d.Capacity[resourceapi.QualifiedName(driver+"/"+name)]
	return c, ok
}

func capacityBytes(d *resourceapi.Device, driver, name string) int64 {
	if c, ok := capacity(d, driver, name); ok {
		return c.Value.Value()
	}
	return 0
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

// HeldShare is the part of its GPU a claim holds with device d of the
// driver, having consumed consumedMemory bytes of it (0: none recorded):
// a whole GPU 1, a time-slice replica 1/replicas, a MIG device its compute
// slices' share, a shared device the share of its memory. The node's
// plugin divides the use it measures by it (use per GPU unit held).
func HeldShare(d *resourceapi.Device, driver string, consumedMemory int64) Units {
	if stringAttr(d, driver, AttrType) == TypeShared && consumedMemory > 0 {
		return shareUnits(consumedMemory, capacityBytes(d, driver, CapacityMemory))
	}
	u, _ := deviceUnits(d, driver)
	return u
}
