package quota

import (
	"context"

	resourceapi "k8s.io/api/resource/v1"
)

// Candidate is a device a request can be allocated, and the memory that
// allocation consumes of it (a share's request after the device's request
// policy; the device's memory otherwise).
type Candidate struct {
	Device *Device
	Memory int64
}

// Candidates are the devices of the inventory a request of class, with
// selectors sel and capacity capReq, can be allocated: the class's and the
// request's selectors match, as the scheduler evaluates them, and the
// capacity fits. An unknown class has none. The webhook bounds a claim's
// settings by what any of them allows.
func (p *Pricer) Candidates(ctx context.Context, class string, sel []resourceapi.DeviceSelector, capReq *resourceapi.CapacityRequirements) []Candidate {
	if p.classes[class] == nil {
		return nil
	}
	exprs := p.selectors(class, sel)
	var out []Candidate
	for _, d := range p.inv.Devices() {
		if !Matches(ctx, d, exprs) {
			continue
		}
		if mem, ok := consumedMemory(d, p.inv.Driver(), capReq); ok {
			out = append(out, Candidate{Device: d, Memory: mem})
		}
	}
	return out
}
