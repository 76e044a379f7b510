package billing

import (
	"fmt"
	"math/big"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
)

// Bounds on one TenantUsage's size: closed records kept for audit (all of
// them are in the totals) and the totals' entries; past maxTotals a new
// entry is folded into its entry without a node.
const (
	maxRecent = 64
	maxTotals = 256
	maxPods   = 16
)

// Period is the UTC calendar month of t: its name (yyyy-mm) and bounds.
func Period(t time.Time) (name string, start, end time.Time) {
	t = t.UTC()
	start = time.Date(t.Year(), t.Month(), 1, 0, 0, 0, 0, time.UTC)
	return start.Format("2006-01"), start, start.AddDate(0, 1, 0)
}

// UsageName is the TenantUsage of a tenant and period.
func UsageName(tenant, period string) string { return tenant + "-" + period }

func newUsage(tenant string, at time.Time, currency string) *gpuaas.TenantUsage {
	name, start, end := Period(at)
	return &gpuaas.TenantUsage{
		ObjectMeta: metav1.ObjectMeta{Name: UsageName(tenant, name)},
		Spec:       gpuaas.TenantUsageSpec{Tenant: tenant, Period: name, Start: metav1.NewTime(start), End: metav1.NewTime(end)},
		Status:     gpuaas.TenantUsageStatus{Currency: currency},
	}
}

// ratOf parses an exact rational as the records write it ("0" when
// empty).
func ratOf(s string) *big.Rat {
	r, ok := new(big.Rat).SetString(s)
	if !ok {
		return new(big.Rat)
	}
	return r
}

func priceRat(q resource.Quantity) *big.Rat {
	r, ok := new(big.Rat).SetString(q.AsDec().String())
	if !ok {
		return new(big.Rat)
	}
	return r
}

// unitSecondsBetween is units times the whole seconds of [from, to).
func unitSecondsBetween(units string, from, to time.Time) *big.Rat {
	secs := int64(to.Sub(from) / time.Second)
	if secs <= 0 {
		return new(big.Rat)
	}
	return new(big.Rat).Mul(ratOf(units), new(big.Rat).SetInt64(secs))
}

// costOf is unit-seconds at a price per unit-hour.
func costOf(unitSeconds *big.Rat, price resource.Quantity) *big.Rat {
	c := new(big.Rat).Mul(unitSeconds, priceRat(price))
	return c.Quo(c, big.NewRat(3600, 1))
}

func money(r *big.Rat) string { return r.FloatString(6) }

// settle writes a record's unit-seconds and cost up to its end (its
// lastSeen while open).
func settle(rec *gpuaas.UsageRecord) {
	to := rec.LastSeen.Time
	if rec.End != nil {
		to = rec.End.Time
	}
	us := unitSecondsBetween(rec.Units, rec.Start.Time, to)
	rec.UnitSeconds = us.RatString()
	rec.Cost = money(costOf(us, rec.Price))
	settleUse(rec)
}

// closeRecord ends the open record at index i of u at end and rolls it up:
// its use up to end as obs says (nil: as last accounted). It returns the
// closed record.
func closeRecord(u *gpuaas.TenantUsage, i int, end time.Time, uncertainUntil *time.Time, obs *useObs) gpuaas.UsageRecord {
	rec := u.Status.Open[i]
	u.Status.Open = slices.Delete(u.Status.Open, i, i+1)
	if end.Before(rec.Start.Time) {
		end = rec.Start.Time
	}
	// Never before what a leader already checkpointed: a new leader's
	// clock may be behind the old one's.
	if end.Before(rec.LastSeen.Time) {
		end = rec.LastSeen.Time
	}
	if obs == nil {
		o := going(&rec)
		obs = &o
	}
	accountUse(&rec, *obs, end)
	rec.End = ptrTime(end)
	rec.LastSeen = metav1.NewTime(end)
	if uncertainUntil != nil {
		rec.EndUncertain = true
		rec.UncertainUntil = ptrTime(*uncertainUntil)
	}
	settle(&rec)
	closed := rec
	rec.Use, rec.UseSince = "", nil // the state of an open record only
	u.Status.Recent = append(u.Status.Recent, rec)
	if over := len(u.Status.Recent) - maxRecent; over > 0 {
		u.Status.Recent = slices.Delete(u.Status.Recent, 0, over)
	}
	addToTotals(u, &rec)
	return closed
}

func ptrTime(t time.Time) *metav1.Time { m := metav1.NewTime(t); return &m }

// addToTotals folds a closed record into its (profile, shape, GPU model,
// node, price) entry; past maxTotals into the entry without a node.
func addToTotals(u *gpuaas.TenantUsage, rec *gpuaas.UsageRecord) {
	i := findTotal(u.Status.Totals, rec, rec.Node)
	if i < 0 && len(u.Status.Totals) >= maxTotals {
		i = findTotal(u.Status.Totals, rec, "")
	}
	if i < 0 {
		node := rec.Node
		if len(u.Status.Totals) >= maxTotals {
			node = ""
		}
		u.Status.Totals = append(u.Status.Totals, gpuaas.UsageTotal{Profile: rec.Profile, Shape: rec.Shape,
			GpuModel: rec.GpuModel, Node: node, Price: rec.Price, UnitSeconds: "0", Cost: money(new(big.Rat))})
		i = len(u.Status.Totals) - 1
	}
	t := &u.Status.Totals[i]
	t.Records++
	if rec.EndUncertain {
		t.UncertainRecords++
	}
	us := new(big.Rat).Add(ratOf(t.UnitSeconds), ratOf(rec.UnitSeconds))
	t.UnitSeconds = us.RatString()
	t.UsedUnitSeconds = new(big.Rat).Add(ratOf(t.UsedUnitSeconds), ratOf(rec.UsedUnitSeconds)).RatString()
	t.IdleUnitSeconds = new(big.Rat).Add(ratOf(t.IdleUnitSeconds), ratOf(rec.IdleUnitSeconds)).RatString()
	t.UnknownUseUnitSeconds = unknownOf(t.UnitSeconds, t.UsedUnitSeconds, t.IdleUnitSeconds)
	// Cost from the entry's unit-seconds, not a sum of rounded costs.
	t.Cost = money(costOf(us, t.Price))
}

func findTotal(totals []gpuaas.UsageTotal, rec *gpuaas.UsageRecord, node string) int {
	return slices.IndexFunc(totals, func(t gpuaas.UsageTotal) bool {
		return t.Profile == rec.Profile && t.Shape == rec.Shape && t.GpuModel == rec.GpuModel &&
			t.Node == node && t.Price.Cmp(rec.Price) == 0
	})
}

// summarize writes the period's totals: the closed records and the open
// ones up to their lastSeen.
func summarize(u *gpuaas.TenantUsage) {
	us, cost, used, idle := new(big.Rat), new(big.Rat), new(big.Rat), new(big.Rat)
	for _, t := range u.Status.Totals {
		us.Add(us, ratOf(t.UnitSeconds))
		cost.Add(cost, costOf(ratOf(t.UnitSeconds), t.Price))
		used.Add(used, ratOf(t.UsedUnitSeconds))
		idle.Add(idle, ratOf(t.IdleUnitSeconds))
	}
	for i := range u.Status.Open {
		rec := &u.Status.Open[i]
		settle(rec)
		rus := ratOf(rec.UnitSeconds)
		us.Add(us, rus)
		cost.Add(cost, costOf(rus, rec.Price))
		used.Add(used, ratOf(rec.UsedUnitSeconds))
		idle.Add(idle, ratOf(rec.IdleUnitSeconds))
	}
	u.Status.UnitSeconds = us.RatString()
	u.Status.Cost = money(cost)
	u.Status.UsedUnitSeconds, u.Status.IdleUnitSeconds = used.RatString(), idle.RatString()
	u.Status.UnknownUseUnitSeconds = unknownOf(u.Status.UnitSeconds, u.Status.UsedUnitSeconds, u.Status.IdleUnitSeconds)
	u.Status.OpenRecords = int32(len(u.Status.Open)) //nolint:gosec // bounded by the tenant's allocations
}

// recordKey identifies an open record: one claim's hold of one device.
func recordKey(rec *gpuaas.UsageRecord) string { return fmt.Sprintf("%s/%s", rec.ClaimUID, rec.Device) }
