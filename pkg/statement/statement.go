// Package statement turns a tenant's TenantUsage (one UTC month of billed
// usage, written by the controller's billing recorder) into a statement: its
// usage and cost per profile (or shape), GPU model and price, as text for a
// tenant admin and as CSV with FOCUS-named columns for finance tools
// (docs/platform.md, "Statements").
package statement

import (
	"cmp"
	"math/big"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
)

// Line is the usage of one profile (or shape), GPU model and price over
// the period: closed records and open ones up to their last observation.
type Line struct {
	// Name is the profile's, or the shape's when priced by the shape.
	Name string
	// Kind is GpuProfile or GpuShape.
	Kind     string
	GpuModel string
	// Price per GPU-unit-hour.
	Price resource.Quantity
	// UnitSeconds and Cost, exact.
	UnitSeconds, Cost *big.Rat
	// Used, Idle and UnknownUse split UnitSeconds by the devices' use as
	// their plugins reported it (unknown: not reported, or not observed);
	// IdleCost is what Idle cost.
	Used, Idle, UnknownUse, IdleCost *big.Rat
	// Records closed and still open.
	Records, Open int64
	// Uncertain: closed records whose end fell while no leader ran.
	Uncertain int64
}

// Statement is one tenant's period.
type Statement struct {
	Tenant, Period, Currency string
	Start, End               time.Time
	// AsOf is the latest observation in the records: the statement covers
	// [Start, AsOf).
	AsOf        time.Time
	Lines       []Line
	UnitSeconds *big.Rat
	Cost        *big.Rat
	// Used, Idle, UnknownUse and IdleCost: the lines' sums.
	Used, Idle, UnknownUse, IdleCost *big.Rat
}

// Closed says whether the period is over at now.
func (s *Statement) Closed(now time.Time) bool { return !now.Before(s.End) }

// FromUsage is the statement of a TenantUsage.
func FromUsage(u *gpuaas.TenantUsage) Statement {
	s := Statement{Tenant: u.Spec.Tenant, Period: u.Spec.Period, Currency: u.Status.Currency,
		Start: u.Spec.Start.UTC(), End: u.Spec.End.UTC(), AsOf: u.Spec.Start.UTC(),
		UnitSeconds: new(big.Rat), Cost: new(big.Rat), Used: new(big.Rat), Idle: new(big.Rat), UnknownUse: new(big.Rat), IdleCost: new(big.Rat)}
	type key struct{ name, kind, model, price string }
	lines := map[key]*Line{}
	line := func(profile, shape, model string, price resource.Quantity) *Line {
		k := key{profile, "GpuProfile", model, price.AsDec().String()}
		if shape != "" {
			k.name, k.kind = shape, "GpuShape"
		}
		l, ok := lines[k]
		if !ok {
			l = &Line{Name: k.name, Kind: k.kind, GpuModel: model, Price: price, UnitSeconds: new(big.Rat), Cost: new(big.Rat),
				Used: new(big.Rat), Idle: new(big.Rat), UnknownUse: new(big.Rat), IdleCost: new(big.Rat)}
			lines[k] = l
		}
		return l
	}
	for _, t := range u.Status.Totals {
		l := line(t.Profile, t.Shape, t.GpuModel, t.Price)
		l.UnitSeconds.Add(l.UnitSeconds, ratOf(t.UnitSeconds))
		l.Used.Add(l.Used, ratOf(t.UsedUnitSeconds))
		l.Idle.Add(l.Idle, ratOf(t.IdleUnitSeconds))
		l.Records += t.Records
		l.Uncertain += t.UncertainRecords
	}
	for _, rec := range u.Status.Recent {
		if rec.End != nil && rec.End.After(s.AsOf) {
			s.AsOf = rec.End.UTC()
		}
	}
	for _, rec := range u.Status.Open {
		l := line(rec.Profile, rec.Shape, rec.GpuModel, rec.Price)
		l.UnitSeconds.Add(l.UnitSeconds, ratOf(rec.UnitSeconds))
		l.Used.Add(l.Used, ratOf(rec.UsedUnitSeconds))
		l.Idle.Add(l.Idle, ratOf(rec.IdleUnitSeconds))
		l.Open++
		if rec.LastSeen.After(s.AsOf) {
			s.AsOf = rec.LastSeen.UTC()
		}
	}
	for _, l := range lines {
		// Cost from the line's unit-seconds, as the records' totals are,
		// not a sum of rounded costs.
		l.Cost = costOf(l.UnitSeconds, l.Price)
		// Unknown is the rest: records written before uses were
		// recorded have none, and read as unknown, never as used.
		l.UnknownUse.Sub(l.UnitSeconds, l.Used).Sub(l.UnknownUse, l.Idle)
		l.IdleCost = costOf(l.Idle, l.Price)
		s.UnitSeconds.Add(s.UnitSeconds, l.UnitSeconds)
		s.Cost.Add(s.Cost, l.Cost)
		s.Used.Add(s.Used, l.Used)
		s.Idle.Add(s.Idle, l.Idle)
		s.UnknownUse.Add(s.UnknownUse, l.UnknownUse)
		s.IdleCost.Add(s.IdleCost, l.IdleCost)
		s.Lines = append(s.Lines, *l)
	}
	slices.SortFunc(s.Lines, func(a, b Line) int {
		return cmp.Or(cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.Name, b.Name), cmp.Compare(a.GpuModel, b.GpuModel),
			a.Price.Cmp(b.Price))
	})
	if s.AsOf.After(s.End) {
		s.AsOf = s.End
	}
	return s
}

func ratOf(s string) *big.Rat {
	r, ok := new(big.Rat).SetString(s)
	if !ok {
		return new(big.Rat)
	}
	return r
}

func costOf(unitSeconds *big.Rat, price resource.Quantity) *big.Rat {
	c := new(big.Rat).Mul(unitSeconds, ratOf(price.AsDec().String()))
	return c.Quo(c, big.NewRat(3600, 1))
}

// hours is unit-seconds as GPU-unit-hours, to six decimals.
func hours(unitSeconds *big.Rat) string {
	return new(big.Rat).Quo(unitSeconds, big.NewRat(3600, 1)).FloatString(6)
}

func money(r *big.Rat) string { return r.FloatString(6) }

// priceString is a price in plain decimals without trailing zeros ("2.5").
func priceString(q resource.Quantity) string {
	r := ratOf(q.AsDec().String())
	if r.IsInt() {
		return r.RatString()
	}
	return strings.TrimRight(r.FloatString(9), "0")
}
