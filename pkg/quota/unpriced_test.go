package quota

import (
	"strings"
	"testing"
)

// Issue 26 item 3: with nothing published that matches, allocationMode All
// was priced at the largest node's GPUs (at least one) and memory at 0, so a
// pending All claim took every GPU of the next node that joined and a
// memory limit was not enforced. Such a claim is refused for a tenant with
// a limit it could slip past.
func TestUnpricedClaimsAreRefused(t *testing.T) {
	empty := NewPricer(NewInventory(DriverName, nil), testClasses(), map[string]bool{"h100": true})
	units, mem := WholeUnits(8), gi(80)
	withUnits := Tenant{Name: "u", Limits: Limits{Units: &units}}
	memLimited := Tenant{Name: "m", Limits: Limits{Memory: &mem}}
	withDevices := Tenant{Name: "d", Limits: Limits{Devices: map[string]int64{"mig-1g": 2}}}
	unlimited := Tenant{Name: "free"}
	cases := []struct {
		name    string
		req     func() []Unpriced
		refused []Tenant
		allowed []Tenant
		reason  string
	}{
		{
			name:    "All of a class nothing published matches, on a fresh cluster",
			req:     func() []Unpriced { return empty.Unpriced(t.Context(), claimSpec(exact("r", "h100", 0, allMode))) },
			refused: []Tenant{withUnits, memLimited, withDevices},
			allowed: []Tenant{unlimited},
			reason:  `allocationMode All of class "h100" cannot be charged before devices of the class are published`,
		},
		{
			name: "All of a class that matches nothing while other nodes are published",
			req: func() []Unpriced {
				return testPricer().Unpriced(t.Context(), claimSpec(exact("r", "future", 0, allMode)))
			},
			refused: []Tenant{withUnits, memLimited, withDevices},
			allowed: []Tenant{unlimited},
			reason:  `allocationMode All of class "future"`,
		},
		{
			name:    "memory of a device when nothing is published",
			req:     func() []Unpriced { return empty.Unpriced(t.Context(), claimSpec(exact("r", "h100", 1))) },
			refused: []Tenant{memLimited},
			allowed: []Tenant{withUnits, withDevices, unlimited},
			reason:  `the gpuMemory of a device of class "h100" cannot be charged`,
		},
		{
			name: "an alternative of firstAvailable counts",
			req: func() []Unpriced {
				return empty.Unpriced(t.Context(), claimSpec(firstAvailable("r", exact("a", "nic", 1), exact("b", "h100", 0, allMode))))
			},
			refused: []Tenant{withUnits},
			reason:  `allocationMode All of class "h100"`,
		},
		{
			name: "memory asked for is a bound",
			req: func() []Unpriced {
				return empty.Unpriced(t.Context(), claimSpec(exact("r", "h100", 1, withMemory("10Gi"))))
			},
			allowed: []Tenant{memLimited, withUnits},
		},
		{
			name: "published devices bound All and memory",
			req: func() []Unpriced {
				return testPricer().Unpriced(t.Context(), claimSpec(exact("r", "h100", 0, allMode)))
			},
			allowed: []Tenant{memLimited, withUnits, withDevices},
		},
		{
			name: "a foreign class and admin access are free",
			req: func() []Unpriced {
				return empty.Unpriced(t.Context(), claimSpec(exact("a", "nic", 0, allMode), exact("b", "h100", 0, allMode, adminAccess)))
			},
			allowed: []Tenant{memLimited, withUnits, withDevices},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			parts := tc.req()
			for _, tn := range tc.refused {
				d := DecideUnpriced(tn, parts)
				if d.Allowed || d.Resource != ResourceUnpriced || !strings.Contains(d.Reason, tc.reason) ||
					!strings.Contains(d.Reason, `TenantQuota "`+tn.Name+`" cannot charge the claim yet`) {
					t.Errorf("tenant %s: %+v, want refused with %q", tn.Name, d, tc.reason)
				}
			}
			for _, tn := range tc.allowed {
				if d := DecideUnpriced(tn, parts); !d.Allowed {
					t.Errorf("tenant %s refused: %s", tn.Name, d.Reason)
				}
			}
		})
	}
}
