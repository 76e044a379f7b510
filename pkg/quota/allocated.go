package quota

import (
	"context"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/utils/ptr"
)

// Charged is a claim's charge and whether it is trued up from an
// allocation (Used) or still the worst case of an admitted claim (Reserved).
type Charged struct {
	Charge    Charge
	Allocated bool
}

// Cost is what a claim is charged now: from its allocation when it has one;
// nothing when it has none and is being deleted, as the scheduler never
// allocates a claim being deleted, so a finalizer that keeps it (a
// borrower's own, to defeat reclaim) holds no quota with it; else its worst
// case (ClaimCost).
func (p *Pricer) Cost(ctx context.Context, claim *resourceapi.ResourceClaim) Charged {
	if claim.Status.Allocation == nil && claim.DeletionTimestamp != nil {
		return Charged{}
	}
	if claim.Status.Allocation == nil {
		return Charged{Charge: p.ClaimCost(ctx, &claim.Spec)}
	}
	return Charged{Charge: p.AllocatedCost(ctx, claim), Allocated: true}
}

// AllocatedCost trues a claim up from its allocation: each allocated device
// of our driver at its own weight (a shared device at the memory it
// consumed), counted against the class of the request that got it, and
// the shapes its spec is an instance of. Admin access results cost
// nothing.
func (p *Pricer) AllocatedCost(ctx context.Context, claim *resourceapi.ResourceClaim) Charge {
	var total Charge
	driver := p.inv.Driver()
	for _, res := range claim.Status.Allocation.Devices.Results {
		if res.Driver != driver || ptr.Deref(res.AdminAccess, false) {
			continue
		}
		total = total.Add(p.resultCharge(ctx, claim, &res))
	}
	// An allocated instance of a shape is still one, whichever devices
	// it got.
	total.Shapes = p.shapes(&claim.Spec)
	return total
}

// Held is one device of our driver a claim holds, as billing records it.
type Held struct {
	Request string // the request's name ("gpu", "gpu/small")
	Class   string // the DeviceClass of the request
	Device  DeviceID
	Model   string // the device's productName attribute; "" when unknown
	Charge  Charge
	Shapes  map[string]int64 // the shapes the claim is an instance of
}

// HeldDevices is AllocatedCost device by device: what billing records per
// allocated device. Admin access results hold nothing.
func (p *Pricer) HeldDevices(ctx context.Context, claim *resourceapi.ResourceClaim) []Held {
	if claim.Status.Allocation == nil {
		return nil
	}
	var out []Held
	driver := p.inv.Driver()
	shapes := p.shapes(&claim.Spec)
	for _, res := range claim.Status.Allocation.Devices.Results {
		if res.Driver != driver || ptr.Deref(res.AdminAccess, false) {
			continue
		}
		id := DeviceID{Driver: res.Driver, Pool: res.Pool, Device: res.Device}
		class, _, _ := findRequest(&claim.Spec, res.Request)
		h := Held{Request: res.Request, Class: class, Device: id, Charge: p.resultCharge(ctx, claim, &res), Shapes: shapes}
		if d := p.inv.Get(id); d != nil {
			if a, ok := d.Basic.Attributes["productName"]; ok && a.StringValue != nil {
				h.Model = *a.StringValue
			}
		}
		out = append(out, h)
	}
	return out
}

func (p *Pricer) resultCharge(ctx context.Context, claim *resourceapi.ResourceClaim, res *resourceapi.DeviceRequestAllocationResult) Charge {
	class, sel, capReq := findRequest(&claim.Spec, res.Request)
	d := p.inv.Get(DeviceID{Driver: res.Driver, Pool: res.Pool, Device: res.Device})
	if d == nil {
		// The device is gone from the slices (node deleted, republish in
		// flight): charge one device at the request's worst case.
		return p.priceOf(ctx, class, sel, capReq).device
	}
	devices := p.devicesOf(ctx, d, class)
	if ptr.Deref(d.Basic.AllowMultipleAllocations, false) {
		mem, ok := memoryOf(res.ConsumedCapacity, p.inv.Driver())
		if !ok {
			mem, _ = consumedMemory(d, p.inv.Driver(), capReq)
		}
		return Charge{Units: shareUnits(mem, d.Memory), Memory: mem, Devices: devices}
	}
	return Charge{Units: d.Units, Memory: d.Memory, Devices: devices}
}

// findRequest resolves an allocation result's request name ("gpu" or, for
// firstAvailable, "gpu/small") to the class, selectors and capacity asked.
func findRequest(spec *resourceapi.ResourceClaimSpec, name string) (string, []resourceapi.DeviceSelector, *resourceapi.CapacityRequirements) {
	parent, sub, isSub := strings.Cut(name, "/")
	for _, r := range spec.Devices.Requests {
		if r.Name != parent {
			continue
		}
		if r.Exactly != nil && !isSub {
			return r.Exactly.DeviceClassName, r.Exactly.Selectors, r.Exactly.Capacity
		}
		for _, s := range r.FirstAvailable {
			if s.Name == sub {
				return s.DeviceClassName, s.Selectors, s.Capacity
			}
		}
	}
	return "", nil, nil
}
