package quota

import (
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
)

// TestDecideShapeLimit (issue 38 item 5): limits.shapes caps a tenant's
// instances of a shape, used and reserved alike, strictly: an idle cohort
// lends none. Claims of other shapes, or of none, pass it.
func TestDecideShapeLimit(t *testing.T) {
	slot := Charge{Units: WholeUnits(1), Memory: gi(80), Devices: map[string]int64{"h100": 1}, Shapes: map[string]int64{"slot": 1}}
	plain := Charge{Units: WholeUnits(1), Memory: gi(80), Devices: map[string]int64{"h100": 1}}
	team := Tenant{Name: "team-a", Cohort: "research", Limits: Limits{Units: units(8, 1), Shapes: map[string]int64{"slot": 2}}}
	rich := Peer{Tenant: Tenant{Name: "team-b", Cohort: "research", Limits: Limits{Units: units(8, 1), Shapes: map[string]int64{"slot": 9}}}}
	oneEach := Usage{Used: slot, Reserved: slot}
	for _, tc := range []struct {
		name    string
		usage   Usage
		req     Charge
		allowed bool
		reason  string
	}{
		{name: "below the limit", usage: Usage{Used: slot}, req: slot, allowed: true},
		{name: "at the limit: refused, not borrowed", usage: oneEach, req: slot,
			reason: `TenantQuota "team-a" exceeded: instances of shape "slot": used 1, reserved 1, requested 1, limit 2 (2 of 2 in use)`},
		{name: "the same devices outside the shape", usage: oneEach, req: plain, allowed: true},
		{name: "another shape", usage: oneEach, req: plain.Add(Charge{Shapes: map[string]int64{"pair": 1}}), allowed: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := Decide(team, tc.usage, tc.req, []Peer{rich})
			if d.Allowed != tc.allowed {
				t.Fatalf("allowed = %v (%s), want %v", d.Allowed, d.Reason, tc.allowed)
			}
			if tc.reason != "" && (d.Reason != tc.reason || d.Resource != "shapes/slot" || !IsShapeResource(d.Resource)) {
				t.Errorf("refused for %s: %q\nwant shapes/slot: %q", d.Resource, d.Reason, tc.reason)
			}
		})
	}
}

// TestShapesCharged: instances add, subtract and take the worst case like
// devices; a charge of shapes only is not free; a tally sums them.
func TestShapesCharged(t *testing.T) {
	a := Charge{Shapes: map[string]int64{"slot": 1}}
	b := Charge{Shapes: map[string]int64{"slot": 2, "node": 1}}
	if a.IsZero() {
		t.Error("an instance of a shape costs nothing")
	}
	if got := a.Add(b).Shapes; got["slot"] != 3 || got["node"] != 1 {
		t.Errorf("a+b = %v", got)
	}
	if got := b.Sub(a).Shapes; got["slot"] != 1 || got["node"] != 1 {
		t.Errorf("b-a = %v", got)
	}
	if got := a.Max(b).Shapes; got["slot"] != 2 || got["node"] != 1 {
		t.Errorf("max(a, b) = %v", got)
	}
	if got := b.Times(3).Shapes; got["slot"] != 6 || got["node"] != 3 {
		t.Errorf("3b = %v", got)
	}
	if s := b.String(); !strings.Contains(s, "shapes=[node:1 slot:2]") {
		t.Errorf("String() = %q", s)
	}
	var tally Tally
	tally.Add(a, true)
	tally.Add(b, false)
	tally.Add(a, false)
	u := tally.Usage()
	if u.Used.Shapes["slot"] != 1 || u.Reserved.Shapes["slot"] != 3 || u.Reserved.Shapes["node"] != 1 {
		t.Errorf("tally used %v, reserved %v", u.Used.Shapes, u.Reserved.Shapes)
	}
}

// TestPricerChargesShapes: a pricer given the shape test charges what it
// names, worst case and allocated alike, on top of the devices; one
// without it charges no shapes.
func TestPricerChargesShapes(t *testing.T) {
	spec := &resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
		Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "h100", AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1},
	}}}}
	claim := &resourceapi.ResourceClaim{Spec: *spec}
	claim.Status.Allocation = &resourceapi.AllocationResult{}
	p := NewPricer(NewInventory(DriverName, nil), nil, nil)
	if c := p.ClaimCost(t.Context(), spec); c.Shapes != nil {
		t.Errorf("without shapes: charged %v", c.Shapes)
	}
	p.WithShapes(func(s *resourceapi.ResourceClaimSpec) map[string]int64 {
		if s != spec && s != &claim.Spec {
			return nil
		}
		return map[string]int64{"slot": 1}
	})
	if c := p.ClaimCost(t.Context(), spec); c.Shapes["slot"] != 1 {
		t.Errorf("worst case: charged %v, want slot:1", c.Shapes)
	}
	if c := p.Cost(t.Context(), claim); !c.Allocated || c.Charge.Shapes["slot"] != 1 {
		t.Errorf("allocated: charged %+v, want slot:1", c)
	}
}
