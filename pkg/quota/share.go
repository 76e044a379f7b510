package quota

import (
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// consumedMemory is how much memory one allocation of a device takes for
// a request, as the scheduler's allocator works it out (KEP-5075): no request
// takes the policy's default or else everything; a request is rounded up to
// the policy's range step or next valid value. ok is false when the device
// cannot serve the request at all, so it is no candidate.
func consumedMemory(d *Device, driver string, req *resourceapi.CapacityRequirements) (int64, bool) {
	capa, hasCap := capacity(&d.Basic, driver, CapacityMemory)
	var requested *resource.Quantity
	if req != nil {
		if q, ok := quantityIn(req.Requests, driver, CapacityMemory); ok {
			requested = &q
		}
	}
	if !hasCap {
		return 0, requested == nil
	}
	consumed, ok := applyPolicy(requested, capa)
	if !ok || consumed > capa.Value.Value() {
		return 0, false
	}
	return consumed, true
}

func applyPolicy(requested *resource.Quantity, capa resourceapi.DeviceCapacity) (int64, bool) {
	policy := capa.RequestPolicy
	if requested == nil {
		if policy != nil && policy.Default != nil {
			return policy.Default.Value(), true
		}
		return capa.Value.Value(), true
	}
	want := requested.Value()
	switch {
	case policy == nil:
		return want, true
	case policy.ValidRange != nil && policy.ValidRange.Min != nil:
		return roundUpRange(want, policy.ValidRange)
	case len(policy.ValidValues) > 0:
		return roundUpValues(want, policy.ValidValues)
	}
	return want, true
}

func roundUpRange(want int64, r *resourceapi.CapacityRequestPolicyRange) (int64, bool) {
	lo := r.Min.Value()
	if want < lo {
		want = lo
	}
	if r.Step != nil && r.Step.Value() > 0 {
		step := r.Step.Value()
		if rem := (want - lo) % step; rem != 0 {
			want += step - rem
		}
	}
	if r.Max != nil && want > r.Max.Value() {
		return 0, false
	}
	return want, true
}

func roundUpValues(want int64, values []resource.Quantity) (int64, bool) {
	best, found := int64(0), false
	for _, v := range values {
		if x := v.Value(); x >= want && (!found || x < best) {
			best, found = x, true
		}
	}
	return best, found
}
