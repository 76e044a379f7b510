package quota

import (
	"fmt"
	"maps"
	"math/big"
	"slices"
	"strings"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
)

// Resource names as they appear in TenantQuota and in denial reasons.
const (
	ResourceGpuUnits  = "gpuUnits"
	ResourceGpuMemory = "gpuMemory"
	// ResourceUnpriced is the Decision.Resource of a claim refused because
	// its worst case cannot be priced yet (see Unpriced); no limit is
	// exceeded, so nothing may overrule it.
	ResourceUnpriced = "unpriced"
)

// DecideUnpriced refuses a claim with requests that cannot be priced from
// what is published, for a tenant with a limit they could slip past: for
// allocationMode All any limit (the devices it takes, of whatever profile,
// their units and memory are all unknown), for memory a gpuMemory limit.
// Refusing is the conservative choice: charging "a whole node" or "the
// largest memory" needs a node or device to size them by, and with
// nothing published there is none; a template's claim is retried by the
// kube-controller-manager and is admitted once devices are published. A
// request whose pricing was cut short (its deadline, or its CEL budget
// spent: MaxCELCostPerClaim) is refused too for a tenant with any limit:
// its price is a guess.
func DecideUnpriced(t Tenant, parts []Unpriced) Decision {
	limited := t.Limits.Units != nil || t.Limits.Memory != nil || len(t.Limits.Devices) > 0
	var reasons []string
	for _, u := range parts {
		if (u.All && limited) || (u.Memory && t.Limits.Memory != nil) || (u.Interrupted && limited) {
			reasons = append(reasons, u.Reason())
		}
	}
	if len(reasons) == 0 {
		return Decision{Allowed: true}
	}
	return Decision{Resource: ResourceUnpriced,
		Reason: fmt.Sprintf("TenantQuota %q cannot charge the claim yet: %s", t.Name, strings.Join(reasons, "; "))}
}

// ShapeResource is the Decision.Resource of a claim refused by the limit
// on a shape's instances.
func ShapeResource(shape string) string { return shapePrefix + shape }

// IsShapeResource tells a refusal by a shape limit.
func IsShapeResource(resource string) bool { return strings.HasPrefix(resource, shapePrefix) }

const shapePrefix = "shapes/"

// Limits of a tenant; nil means not enforced.
type Limits struct {
	Units   *Units
	Memory  *int64
	Devices map[string]int64
	// Shapes caps instances per GpuShape name; never borrowed.
	Shapes map[string]int64
}

// Tenant is what admission needs of a TenantQuota.
type Tenant struct {
	Name   string
	Cohort string
	Limits Limits
	// Borrow caps borrowing beyond Limits (Units and Memory only); nil
	// means up to what the cohort has idle.
	Borrow Limits
	// ReclaimStandalone: a lender may reclaim the tenant's borrowing claims
	// that no pod's template made, too.
	ReclaimStandalone bool
}

// TenantFromQuota converts a TenantQuota. Quantities convert exactly.
func TenantFromQuota(q *gpuaas.TenantQuota) Tenant {
	t := Tenant{Name: q.Name, Cohort: q.Spec.Cohort, ReclaimStandalone: q.Spec.ReclaimStandaloneClaims}
	t.Limits.Devices = q.Spec.Limits.Devices
	t.Limits.Shapes = q.Spec.Limits.Shapes
	if u := q.Spec.Limits.GpuUnits; u != nil {
		t.Limits.Units = ptrTo(UnitsFromQuantity(*u))
	}
	if m := q.Spec.Limits.GpuMemory; m != nil {
		t.Limits.Memory = ptrTo(m.Value())
	}
	if b := q.Spec.BorrowingLimit; b != nil {
		if b.GpuUnits != nil {
			t.Borrow.Units = ptrTo(UnitsFromQuantity(*b.GpuUnits))
		}
		if b.GpuMemory != nil {
			t.Borrow.Memory = ptrTo(b.GpuMemory.Value())
		}
	}
	return t
}

func ptrTo[T any](v T) *T { return &v }

// Peer is another member of the tenant's cohort and what it holds now
// (Used+Reserved).
type Peer struct {
	Tenant Tenant
	Total  Charge
}

// Decision is the outcome of admission.
type Decision struct {
	Allowed bool
	// Resource is the first resource that was exceeded ("gpuUnits",
	// "gpuMemory", "devices/<profile>", "shapes/<shape>").
	Resource string
	// Reason explains a denial: tenant, resource, used, reserved,
	// requested and limit, and why borrowing did not help.
	Reason string
	// Borrows is true when the claim fits only with quota borrowed from
	// the cohort.
	Borrows bool
	// Lent, for a claim refused only because its tenant's own quota is
	// out on loan in its cohort (the claim is within the tenant's own
	// limits), is what the cohort lacks of each borrowable resource
	// (Units, Memory): what its borrowers would have to give back for the
	// claim to fit. Zero for any other refusal.
	Lent Charge
}

// Decide admits a claim costing req for tenant t, which holds usage, in a
// cohort with peers (t itself excluded). Device limits per profile are
// strict; gpuUnits and gpuMemory beyond the limit may be borrowed from the
// cohort: up to t's borrowing limit. Every admission, borrowing or not,
// keeps the cohort as a whole within the sum of its members' limits.
// Shape limits, like device limits, are strict.
func Decide(t Tenant, usage Usage, req Charge, peers []Peer) Decision {
	return DecideIdle(t, usage, req, IdleOf(t, peers))
}

// PeersIdle is, per borrowable resource, what the other members of a
// tenant's cohort hold idle: the sum over those with a limit on it of the
// limit minus what they hold (negative when they borrow). It is all of the
// cohort that admission needs, so a caller that keeps it as a running sum
// decides without visiting every member.
type PeersIdle struct {
	Units  Units
	Memory Units // bytes, as whole units
}

// IdleOf sums the peers' idle quota (members of other cohorts and t itself
// are skipped).
func IdleOf(t Tenant, peers []Peer) PeersIdle {
	var idle [2]Units
	for _, p := range peers {
		if p.Tenant.Cohort != t.Cohort || p.Tenant.Name == t.Name {
			continue
		}
		for i, dim := range dimensions {
			if l := dim.limit(p.Tenant.Limits); l != nil {
				idle[i] = idle[i].Add(*l).Sub(dim.get(p.Total))
			}
		}
	}
	return PeersIdle{Units: idle[0], Memory: idle[1]}
}

// overCounts calls over, in name order, for each strict per-name limit
// (devices of a profile, instances of a shape) that the request would
// pass; names without a limit are not enforced.
func overCounts(limits, used, reserved, req map[string]int64, over func(name string, used, reserved, requested, limit int64)) {
	for _, name := range slices.Sorted(maps.Keys(req)) {
		limit, ok := limits[name]
		if !ok || req[name] <= 0 {
			continue
		}
		if u, r := used[name], reserved[name]; u+r+req[name] > limit {
			over(name, u, r, req[name], limit)
		}
	}
}

// DecideIdle is Decide with the peers summed up beforehand.
func DecideIdle(t Tenant, usage Usage, req Charge, peers PeersIdle) Decision {
	var violations []string
	d := Decision{Allowed: true}
	fail := func(resource, reason string) {
		if d.Allowed {
			d.Allowed, d.Resource = false, resource
		}
		violations = append(violations, reason)
	}
	overCounts(t.Limits.Devices, usage.Used.Devices, usage.Reserved.Devices, req.Devices, func(class string, used, reserved, requested, limit int64) {
		fail("devices/"+class, fmt.Sprintf("devices of profile %q: used %d, reserved %d, requested %d, limit %d",
			class, used, reserved, requested, limit))
	})
	overCounts(t.Limits.Shapes, usage.Used.Shapes, usage.Reserved.Shapes, req.Shapes, func(name string, used, reserved, requested, limit int64) {
		fail(ShapeResource(name), fmt.Sprintf("instances of shape %q: used %d, reserved %d, requested %d, limit %d (%d of %d in use)",
			name, used, reserved, requested, limit, used+reserved, limit))
	})
	onlyLent := d.Allowed // no device or shape limit refused it
	var lent [2]Units
	for i, dim := range dimensions {
		ok, borrows, reason, owed := dim.check(t, usage, req, dim.idle(peers))
		d.Borrows = d.Borrows || (ok && borrows)
		if !ok {
			fail(dim.name, reason)
			lent[i] = owed
			onlyLent = onlyLent && owed.Sign() > 0
		}
	}
	if !d.Allowed {
		d.Reason = fmt.Sprintf("TenantQuota %q exceeded: %s", t.Name, strings.Join(violations, "; "))
		if onlyLent {
			d.Lent = Charge{Units: lent[0], Memory: ceilInt(lent[1])}
		}
	}
	return d
}

// ceilInt rounds u up to a whole number.
func ceilInt(u Units) int64 {
	n := unitsInt(u)
	if NewUnits(n, 1).Cmp(u) < 0 {
		n++
	}
	return n
}

// dimension is gpuUnits or gpuMemory, the two resources that can be
// borrowed; memory is handled as a whole number of units of bytes.
type dimension struct {
	name   string
	get    func(Charge) Units
	limit  func(Limits) *Units
	format func(Units) string
	idle   func(PeersIdle) Units
}

var dimensions = []dimension{
	{
		name:   ResourceGpuUnits,
		get:    func(c Charge) Units { return c.Units },
		limit:  func(l Limits) *Units { return l.Units },
		format: Units.String,
		idle:   func(p PeersIdle) Units { return p.Units },
	},
	{
		name: ResourceGpuMemory,
		get:  func(c Charge) Units { return WholeUnits(c.Memory) },
		limit: func(l Limits) *Units {
			if l.Memory == nil {
				return nil
			}
			return ptrTo(WholeUnits(*l.Memory))
		},
		format: func(u Units) string { return FormatMemory(unitsInt(u)) },
		idle:   func(p PeersIdle) Units { return p.Memory },
	},
}

func unitsInt(u Units) int64 {
	return new(big.Int).Quo(u.rat().Num(), u.rat().Denom()).Int64()
}

// check admits one resource: within the own limit, or by borrowing.
func (dim dimension) check(t Tenant, usage Usage, req Charge, peersIdle Units) (ok, borrows bool, reason string, lent Units) {
	limit := dim.limit(t.Limits)
	want := dim.get(req)
	if limit == nil || want.Sign() <= 0 {
		return true, false, "", Units{}
	}
	used, reserved := dim.get(usage.Used), dim.get(usage.Reserved)
	after := used.Add(reserved).Add(want)
	f := dim.format
	reason = fmt.Sprintf("%s: used %s, reserved %s, requested %s, limit %s",
		dim.name, f(used), f(reserved), f(want), f(*limit))
	if after.Cmp(*limit) <= 0 {
		return dim.withinCohort(t, usage, want, peersIdle, reason)
	}
	if t.Cohort == "" {
		return false, false, reason, Units{}
	}
	borrow := after.Sub(*limit)
	if cap := dim.limit(t.Borrow); cap != nil && borrow.Cmp(*cap) > 0 {
		return false, false, reason + fmt.Sprintf(" (borrowing %s from cohort %q would exceed the borrowing limit %s)",
			f(borrow), t.Cohort, f(*cap)), Units{}
	}
	idle := dim.cohortIdle(t, usage, peersIdle)
	if want.Cmp(idle) > 0 {
		// Own headroom is part of the cohort's idle quota but not lent.
		headroom := MaxUnits(limit.Sub(used.Add(reserved)), Units{})
		lendable := MaxUnits(idle.Sub(headroom), Units{})
		return false, false, reason + fmt.Sprintf(" (cohort %q has %s idle to lend, %s needed)",
			t.Cohort, f(lendable), f(want.Sub(headroom))), Units{}
	}
	return true, true, "", Units{}
}

// withinCohort admits a claim that fits its tenant's own limit only while
// the cohort stays within the sum of its members' limits. The invariant
// holds always, so a lender whose quota is out on loan waits until the
// borrowers give it back (its claims are denied with that reason and
// retried when quota frees); admitting it anyway would take the cohort past
// the capacity its limits promise, with nothing to reclaim the loan. A
// lender that must not wait caps its peers' borrowingLimit.
func (dim dimension) withinCohort(t Tenant, usage Usage, want, peersIdle Units, reason string) (ok, borrows bool, _ string, lent Units) {
	if t.Cohort == "" {
		return true, false, "", Units{}
	}
	idle := dim.cohortIdle(t, usage, peersIdle)
	if want.Cmp(idle) <= 0 {
		return true, false, "", Units{}
	}
	// lent: what the borrowers owe the claim (Decision.Lent).
	return false, false, reason + fmt.Sprintf(" (within its own limit, but cohort %q has lent it out: %s idle in the cohort; admitted once the borrowers give quota back)",
		t.Cohort, dim.format(MaxUnits(idle, Units{}))), want.Sub(idle)
}

// cohortIdle is the sum of the limits minus the sum of the usage of every
// cohort member that has a limit on this resource (a member without one
// neither lends nor counts): t's own idle plus its peers'.
func (dim dimension) cohortIdle(t Tenant, usage Usage, peersIdle Units) Units {
	return dim.limit(t.Limits).Sub(dim.get(usage.Total())).Add(peersIdle)
}
