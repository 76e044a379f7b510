package quota

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
)

func units(n, d int64) *Units { return ptrTo(NewUnits(n, d)) }

func tenant(name, cohort string, limit *Units, borrow *Units) Tenant {
	return Tenant{Name: name, Cohort: cohort, Limits: Limits{Units: limit}, Borrow: Limits{Units: borrow}}
}

func used(u Units) Usage { return Usage{Used: Charge{Units: u}} }

func TestDecide(t *testing.T) {
	gpu := func(n int64) Charge {
		return Charge{Units: WholeUnits(n), Memory: gi(80 * n), Devices: map[string]int64{"h100": n}}
	}
	mig1g := Charge{Units: NewUnits(1, 7), Memory: gi(10), Devices: map[string]int64{"mig-1g": 1}}

	tests := []struct {
		name    string
		tenant  Tenant
		usage   Usage
		req     Charge
		peers   []Peer
		allowed bool
		borrows bool
		// parts the denial reason must contain
		reason []string
		// lent is the Decision's Lent units: what the borrowers owe a
		// lender refused within its own limit; zero elsewhere.
		lent Units
	}{
		{
			name: "under the limit", tenant: tenant("team-a", "", units(2, 1), nil),
			usage: used(WholeUnits(1)), req: gpu(1), allowed: true,
		},
		{
			name: "at the limit: denied, naming tenant, resource, used, requested, limit", tenant: tenant("team-a", "", units(2, 1), nil),
			usage: used(WholeUnits(2)), req: gpu(1),
			reason: []string{`TenantQuota "team-a" exceeded`, "gpuUnits: used 2, reserved 0, requested 1, limit 2"},
		},
		{
			name: "reserved claims count", tenant: tenant("team-a", "", units(2, 1), nil),
			usage: Usage{Used: Charge{Units: WholeUnits(1)}, Reserved: Charge{Units: WholeUnits(1)}}, req: gpu(1),
			reason: []string{"used 1, reserved 1, requested 1, limit 2"},
		},
		{
			name: "no limit set: anything goes", tenant: tenant("team-a", "", nil, nil),
			usage: used(WholeUnits(100)), req: gpu(8), allowed: true,
		},
		{
			name: "exact fractions: the seventh 1g slice fits a limit of 1", tenant: tenant("team-a", "", units(1, 1), nil),
			usage: used(NewUnits(6, 7)), req: mig1g, allowed: true,
		},
		{
			name: "exact fractions: the eighth does not", tenant: tenant("team-a", "", units(1, 1), nil),
			usage: used(WholeUnits(1)), req: mig1g,
			reason: []string{"gpuUnits: used 1, reserved 0, requested 1/7 (~0.143), limit 1"},
		},
		{
			name:   "device limit per profile",
			tenant: Tenant{Name: "team-a", Limits: Limits{Devices: map[string]int64{"h100": 1}}},
			usage:  Usage{Used: gpu(1)}, req: gpu(1),
			reason: []string{`devices of profile "h100": used 1, reserved 0, requested 1, limit 1`},
		},
		{
			name:   "device limit of another profile does not apply",
			tenant: Tenant{Name: "team-a", Limits: Limits{Devices: map[string]int64{"mig-1g": 0}}},
			req:    gpu(1), allowed: true,
		},
		{
			name:   "memory limit, written as a quantity",
			tenant: Tenant{Name: "team-a", Limits: Limits{Memory: ptrTo(gi(100))}},
			usage:  Usage{Used: Charge{Memory: gi(40)}}, req: gpu(1),
			reason: []string{"gpuMemory: used 40Gi, reserved 0, requested 80Gi, limit 100Gi"},
		},
		{
			name:   "every exceeded resource is named",
			tenant: Tenant{Name: "team-a", Limits: Limits{Units: units(1, 1), Memory: ptrTo(gi(10)), Devices: map[string]int64{"h100": 0}}},
			req:    gpu(2),
			reason: []string{`devices of profile "h100"`, "gpuUnits:", "gpuMemory:"},
		},
		{
			name: "borrowing from an idle cohort peer", tenant: tenant("team-a", "research", units(1, 1), units(1, 1)),
			usage: used(WholeUnits(1)), req: gpu(1),
			peers:   []Peer{{Tenant: tenant("team-b", "research", units(2, 1), nil)}},
			allowed: true, borrows: true,
		},
		{
			name: "borrowing stops at the borrowing limit", tenant: tenant("team-a", "research", units(1, 1), units(1, 1)),
			usage: used(WholeUnits(2)), req: gpu(1),
			peers:  []Peer{{Tenant: tenant("team-b", "research", units(4, 1), nil)}},
			reason: []string{"limit 1", `borrowing 2 from cohort "research" would exceed the borrowing limit 1`},
		},
		{
			name: "zero borrowing limit: no borrowing", tenant: tenant("team-a", "research", units(1, 1), units(0, 1)),
			usage: used(WholeUnits(1)), req: mig1g,
			peers:  []Peer{{Tenant: tenant("team-b", "research", units(4, 1), nil)}},
			reason: []string{"borrowing limit 0"},
		},
		{
			name: "no borrowing limit: up to what the cohort has idle", tenant: tenant("team-a", "research", units(1, 1), nil),
			usage: used(WholeUnits(1)), req: gpu(2),
			peers:   []Peer{{Tenant: tenant("team-b", "research", units(2, 1), nil)}},
			allowed: true, borrows: true,
		},
		{
			name: "the cohort's idle quota is used up", tenant: tenant("team-a", "research", units(1, 1), nil),
			usage: used(WholeUnits(1)), req: gpu(1),
			peers:  []Peer{{Tenant: tenant("team-b", "research", units(2, 1), nil), Total: Charge{Units: NewUnits(3, 2)}}},
			reason: []string{`cohort "research" has 0.5 idle to lend, 1 needed`},
		},
		{
			name: "own headroom first, the rest borrowed", tenant: tenant("team-a", "research", units(2, 1), units(1, 2)),
			usage: used(NewUnits(3, 2)), req: gpu(1),
			peers:   []Peer{{Tenant: tenant("team-b", "research", units(1, 1), nil)}},
			allowed: true, borrows: true,
		},
		{
			// Issue 12 item 10: the lender was admitted within its own
			// limit and the cohort reached 4 units against limits of 3.
			name: "a lender whose quota is on loan waits for it", tenant: tenant("team-b", "research", units(2, 1), nil),
			usage: used(WholeUnits(1)), req: gpu(1),
			peers:  []Peer{{Tenant: tenant("team-a", "research", units(1, 1), nil), Total: Charge{Units: WholeUnits(2)}}},
			reason: []string{"limit 2", `within its own limit, but cohort "research" has lent it out: 0 idle`},
			lent:   WholeUnits(1),
		},
		{
			name: "a lender short of part of a claim is owed that part", tenant: tenant("team-b", "research", units(2, 1), nil),
			usage: used(WholeUnits(0)), req: gpu(2),
			peers:  []Peer{{Tenant: tenant("team-a", "research", units(1, 1), nil), Total: Charge{Units: NewUnits(3, 2)}}},
			reason: []string{"has lent it out: 1.5 idle"},
			lent:   NewUnits(1, 2),
		},
		{
			name: "a lender also over a device limit is owed nothing", tenant: Tenant{Name: "team-b", Cohort: "research",
				Limits: Limits{Units: units(2, 1), Devices: map[string]int64{"h100": 0}}},
			usage: used(WholeUnits(1)), req: gpu(1),
			peers:  []Peer{{Tenant: tenant("team-a", "research", units(1, 1), nil), Total: Charge{Units: WholeUnits(2)}}},
			reason: []string{"has lent it out", `devices of profile "h100"`},
		},
		{
			name: "a lender takes back what the borrowers gave back", tenant: tenant("team-b", "research", units(2, 1), nil),
			usage: used(WholeUnits(1)), req: gpu(1),
			peers:   []Peer{{Tenant: tenant("team-a", "research", units(1, 1), nil), Total: Charge{Units: WholeUnits(1)}}},
			allowed: true,
		},
		{
			name: "a peer in another cohort lends nothing", tenant: tenant("team-a", "research", units(1, 1), nil),
			usage: used(WholeUnits(1)), req: gpu(1),
			peers:  []Peer{{Tenant: tenant("team-c", "prod", units(8, 1), nil)}},
			reason: []string{"has 0 idle to lend"},
		},
		{
			name: "a peer without a limit lends nothing", tenant: tenant("team-a", "research", units(1, 1), nil),
			usage: used(WholeUnits(1)), req: gpu(1),
			peers:  []Peer{{Tenant: tenant("team-b", "research", nil, nil)}},
			reason: []string{"has 0 idle to lend"},
		},
		{
			name: "without a cohort there is no borrowing", tenant: tenant("team-a", "", units(1, 1), units(5, 1)),
			usage: used(WholeUnits(1)), req: gpu(1),
			reason: []string{"limit 1"},
		},
		{
			name: "a free claim is always admitted", tenant: tenant("team-a", "", units(0, 1), nil),
			usage: used(WholeUnits(3)), req: Charge{}, allowed: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := Decide(tt.tenant, tt.usage, tt.req, tt.peers)
			if d.Allowed != tt.allowed || d.Borrows != tt.borrows {
				t.Fatalf("Decide = allowed %v borrows %v (%s), want allowed %v borrows %v", d.Allowed, d.Borrows, d.Reason, tt.allowed, tt.borrows)
			}
			for _, part := range tt.reason {
				if !strings.Contains(d.Reason, part) {
					t.Errorf("reason %q lacks %q", d.Reason, part)
				}
			}
			if !d.Allowed && d.Resource == "" {
				t.Error("denial names no resource")
			}
			if d.Lent.Units.Cmp(tt.lent) != 0 {
				t.Errorf("Lent = %s units, want %s", d.Lent.Units, tt.lent)
			}
		})
	}
}

func TestTenantFromQuota(t *testing.T) {
	q := &gpuaas.TenantQuota{ObjectMeta: metav1.ObjectMeta{Name: "team-a"}, Spec: gpuaas.TenantQuotaSpec{
		Cohort: "research",
		Limits: gpuaas.QuotaLimits{
			GpuUnits: ptrTo(resource.MustParse("2.5")), GpuMemory: ptrTo(resource.MustParse("160Gi")),
			Devices: map[string]int64{"h100": 2},
		},
		BorrowingLimit: &gpuaas.BorrowingLimit{GpuUnits: ptrTo(resource.MustParse("500m"))},
	}}
	got := TenantFromQuota(q)
	if got.Limits.Units.Cmp(NewUnits(5, 2)) != 0 || *got.Limits.Memory != gi(160) || got.Limits.Devices["h100"] != 2 {
		t.Errorf("limits = %+v", got.Limits)
	}
	if got.Borrow.Units.Cmp(NewUnits(1, 2)) != 0 || got.Borrow.Memory != nil || got.Cohort != "research" {
		t.Errorf("borrow = %+v, cohort %q", got.Borrow, got.Cohort)
	}
}
