// Package deviceweight says what part of its GPU a device the kubelet plugin
// publishes is, read from the device's attributes alone: a whole GPU 1, a
// time-slice replica 1/replicas, a MIG device its compute slices over the
// GPU's, a shared device the share of its memory a claim consumed. The
// controller charges GPU units by it (pkg/quota) and the plugin normalizes
// the use it measures by it (pkg/plugin/usage); it has no CEL and no quota
// arithmetic, so the plugin builds without the controller's pricing.
package deviceweight

import (
	"fmt"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
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

// Fraction is num/den of a GPU.
type Fraction struct{ Num, Den int64 }

// Float64 is the fraction as a float, for what is not charged (metrics).
func (f Fraction) Float64() float64 { return float64(f.Num) / float64(f.Den) }

var whole = Fraction{1, 1}

// Whole is the weight of a whole device and how it was found (for logs
// and tests). Whatever cannot be worked out is a whole GPU: no device is
// worth more, so the guess never undercharges.
func Whole(d *resourceapi.Device, driver string) (Fraction, string) {
	switch typ := String(d, driver, AttrType); typ {
	case TypeGPU, TypeShared:
		return whole, typ
	case TypeMIG:
		return mig(d, driver)
	case TypeTimeSlice:
		n, ok := Int(d, driver, AttrReplicas)
		if !ok || n < 1 {
			return whole, "timeslice without replicas: charged as a whole GPU"
		}
		return Fraction{1, n}, fmt.Sprintf("timeslice 1/%d", n)
	default:
		return whole, fmt.Sprintf("type %q: charged as a whole GPU", typ)
	}
}

// Held is the part of its GPU a claim holds with device d, having
// consumed consumedMemory bytes of it (0: none recorded): Whole, but for a
// shared device the share of its memory.
func Held(d *resourceapi.Device, driver string, consumedMemory int64) Fraction {
	if String(d, driver, AttrType) == TypeShared && consumedMemory > 0 {
		if total := CapacityBytes(d, driver, CapacityMemory); total > 0 {
			return Fraction{consumedMemory, total}
		}
	}
	f, _ := Whole(d, driver)
	return f
}

// mig is computeSlices/totalComputeSlices. Without computeSlices the
// profile name ("3g.40gb") says it; without the total nothing does.
func mig(d *resourceapi.Device, driver string) (Fraction, string) {
	slices, ok := Int(d, driver, AttrComputeSlices)
	if !ok {
		slices, ok = profileSlices(String(d, driver, AttrProfile))
	}
	total, hasTotal := Int(d, driver, AttrTotalComputeSlices)
	if !ok || !hasTotal || slices < 1 || total < slices {
		return whole, "mig without slice counts: charged as a whole GPU"
	}
	return Fraction{slices, total}, fmt.Sprintf("mig %d/%d", slices, total)
}

// profileSlices reads the GPU-instance slice count of a MIG profile name:
// "3g.40gb" -> 3, "1c.3g.40gb" -> 3.
func profileSlices(profile string) (int64, bool) {
	for _, p := range strings.Split(profile, ".") {
		if g, ok := strings.CutSuffix(p, "g"); ok {
			n, err := strconv.ParseInt(g, 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}

// Attribute looks a name up unqualified and qualified with the driver.
func Attribute(d *resourceapi.Device, driver, name string) (resourceapi.DeviceAttribute, bool) {
	if a, ok := d.Attributes[resourceapi.QualifiedName(name)]; ok {
		return a, true
	}
	a, ok := d.Attributes[resourceapi.QualifiedName(driver+"/"+name)]
	return a, ok
}

// String is a string attribute, "" when absent.
func String(d *resourceapi.Device, driver, name string) string {
	if a, ok := Attribute(d, driver, name); ok && a.StringValue != nil {
		return *a.StringValue
	}
	return ""
}

// Int is an int attribute.
func Int(d *resourceapi.Device, driver, name string) (int64, bool) {
	if a, ok := Attribute(d, driver, name); ok && a.IntValue != nil {
		return *a.IntValue, true
	}
	return 0, false
}

// Capacity looks a capacity up unqualified and qualified with the driver.
func Capacity(d *resourceapi.Device, driver, name string) (resourceapi.DeviceCapacity, bool) {
	if c, ok := d.Capacity[resourceapi.QualifiedName(name)]; ok {
		return c, true
	}
	c, ok := d.Capacity[resourceapi.QualifiedName(driver+"/"+name)]
	return c, ok
}

// CapacityBytes is a capacity's value, 0 when absent.
func CapacityBytes(d *resourceapi.Device, driver, name string) int64 {
	if c, ok := Capacity(d, driver, name); ok {
		return c.Value.Value()
	}
	return 0
}
