package admission

import (
	"context"
	"maps"
	"slices"
	"sync"

	"k8s.io/klog/v2"

	"github.com/gpuaas/gpu-dra-driver/pkg/quota"
)

// A cohort's running total. Borrowing makes each admission depend on what
// every other member of the tenant's cohort holds; summing the ~500 peers of
// a large cohort on every admission, in exact rational arithmetic, was a
// third of the admission's CPU. Instead each book owner (a cohort, or a
// tenant outside any cohort) keeps the sums quota.DecideIdle needs and
// updates them by difference: a namespace's claims when the claim informer
// reports a change there (ClaimChanged marks it dirty), a reservation when
// it starts or stops counting. The sums are exact (rationals), so they
// equal a sum from scratch whatever the order of the updates.

// dimVals holds one value per borrowable resource: gpuUnits, and gpuMemory
// as whole units of bytes, as quota.Decide compares them.
type dimVals [2]quota.Units

func dimsOf(c quota.Charge) dimVals { return dimVals{c.Units, quota.WholeUnits(c.Memory)} }

// plus is v+w on the resources where on is set.
func (v dimVals) plus(w dimVals, on [2]bool) dimVals {
	for i := range v {
		if on[i] {
			v[i] = v[i].Add(w[i])
		}
	}
	return v
}

// minus is v-w on the resources where on is set.
func (v dimVals) minus(w dimVals, on [2]bool) dimVals {
	for i := range v {
		if on[i] {
			v[i] = v[i].Sub(w[i])
		}
	}
	return v
}

var bothDims = [2]bool{true, true}

// cohortUsage is one book owner's running total, for the tenancy and
// catalog generations it was built for. The sums cover the members that
// lend and borrow a resource: valid quotas with a limit on it.
type cohortUsage struct {
	mu                     sync.Mutex // held by a decision from sync to verdict
	catalogGen, tenancyGen int64
	tracked                bool                       // built while the informer was reporting changes
	members                map[string]*cohortMember   // by quota name
	owner                  map[string]*cohortMember   // namespace -> member charged for it
	counted                map[string]*namespaceUsage // namespace -> the usage in claims
	limits, claims, held   dimVals
	reserved               map[string]*heldEntry // counted reservations, by UID
	spare                  map[string]*heldEntry // empty; the next pass's reserved
}

type cohortMember struct {
	tenant     quota.Tenant
	namespaces []string
	counts     [2]bool // valid and limited on the resource: in the sums
	limits     dimVals
}

// heldEntry is a reservation counted in held.
type heldEntry struct {
	r      reservation
	member *cohortMember
	charge quota.Charge
	dims   dimVals
}

// cohortFor is the running total of t's book owner, as of the tenancy
// ten. A decision on an older tenancy than the latest (it raced a quota
// change) gets a total of its own rather than flap the shared one.
func (a *Accountant) cohortFor(ten *tenancy, t quota.Tenant) *cohortUsage {
	a.mu.Lock()
	defer a.mu.Unlock()
	if ten.gen > a.cohortsGen { // drop the totals of cohorts that may be gone
		a.cohorts, a.cohortsGen = map[string]*cohortUsage{}, ten.gen
	}
	if ten.gen < a.cohortsGen {
		return &cohortUsage{}
	}
	key := bookOwner(t)
	g := a.cohorts[key]
	if g == nil {
		g = &cohortUsage{}
		a.cohorts[key] = g
	}
	return g
}

// syncLocked brings g up to date with the cache (caller holds g.mu):
// rebuilt when tenancy or catalog changed (or while no informer reports
// claim changes), else recounted where claims changed.
//
// The claims whose charges are not cached are priced within one recount
// budget (recountBudget) for the whole sync: g.mu is held by every decision
// of the cohort, and one member's claims slow to price (each within its own
// budget) must not hold its peers' admissions for seconds. What the budget
// leaves unpriced counts at its worst case, and its namespace stays dirty:
// the next sync prices on from where this one stopped.
func (a *Accountant) syncLocked(ctx context.Context, cat *priceList, ten *tenancy, g *cohortUsage, key string) error {
	_, tracking := a.claimGen("")
	var dirty []string
	switch {
	case g.catalogGen == 0 || g.tenancyGen != ten.gen || !g.tracked || !tracking:
		g.reset(cat, ten, key, tracking)
		a.takeDirty(g, ten) // before reading: a change from now on marks it again
		dirty = slices.Collect(maps.Keys(g.owner))
	case g.catalogGen != cat.gen:
		// Only prices may have moved: every namespace is counted again
		// (each replaces its own part of the sums), and the members, the
		// limits and the reservations held stay as they are, as they read
		// nothing of the catalog (issue 52). The claims' charges that the
		// change did not move come from the cache.
		g.catalogGen = cat.gen
		a.takeDirty(g, ten)
		dirty = slices.Collect(maps.Keys(g.owner))
	default:
		dirty = a.takeDirty(g, ten)
	}
	pctx, stop := quota.WithCELBudget(ctx, a.recountBudget)
	defer stop()
	if a.legacyRecount {
		pctx = ctx
	}
	for _, ns := range dirty {
		if err := a.countNamespaceLocked(ctx, pctx, cat, g, ns); err != nil {
			g.catalogGen = 0 // half counted: rebuilt by the next caller
			return err
		}
		if g.counted[ns].provisional {
			a.markDirty(ns)
		}
	}
	return nil
}

// markDirty has the next sync of ns's cohort count it again.
func (a *Accountant) markDirty(ns string) {
	a.nsMu.Lock()
	defer a.nsMu.Unlock()
	a.nsDirty[ns] = struct{}{}
}

// reset empties g for the members of key under ten.
func (g *cohortUsage) reset(cat *priceList, ten *tenancy, key string, tracked bool) {
	g.catalogGen, g.tenancyGen, g.tracked = cat.gen, ten.gen, tracked
	g.members, g.owner = map[string]*cohortMember{}, map[string]*cohortMember{}
	g.counted, g.reserved = map[string]*namespaceUsage{}, map[string]*heldEntry{}
	g.limits, g.claims, g.held = dimVals{}, dimVals{}, dimVals{}
	for _, q := range ten.quotas {
		t := ten.tenants[q.Name]
		if bookOwner(t) != key {
			continue
		}
		m := &cohortMember{tenant: t, namespaces: ten.assign.Namespaces[q.Name]}
		for i, l := range [2]*quota.Units{t.Limits.Units, memoryUnits(t.Limits.Memory)} {
			if l != nil && ten.invalid[q.Name] == "" {
				m.counts[i], m.limits[i] = true, *l
			}
		}
		g.limits = g.limits.plus(m.limits, m.counts)
		g.members[q.Name] = m
		for _, ns := range m.namespaces {
			g.owner[ns] = m
		}
	}
}

func memoryUnits(bytes *int64) *quota.Units {
	if bytes == nil {
		return nil
	}
	u := quota.WholeUnits(*bytes)
	return &u
}

// takeDirty hands over the namespaces of g whose claims changed since they
// were last counted, and forgets those no tenant is charged for.
func (a *Accountant) takeDirty(g *cohortUsage, ten *tenancy) []string {
	a.nsMu.Lock()
	defer a.nsMu.Unlock()
	var out []string
	for ns := range a.nsDirty {
		if _, ours := g.owner[ns]; ours {
			out = append(out, ns)
			delete(a.nsDirty, ns)
		} else if _, owned := ten.owner[ns]; !owned {
			delete(a.nsDirty, ns)
		}
	}
	return out
}

// countNamespaceLocked replaces what a namespace's claims add to the sums
// (caller holds g.mu); its claims are priced under pctx.
func (a *Accountant) countNamespaceLocked(ctx, pctx context.Context, cat *priceList, g *cohortUsage, ns string) error {
	nu, err := a.namespaceUsage(ctx, pctx, cat, ns)
	if err != nil {
		return err
	}
	m := g.owner[ns]
	if old := g.counted[ns]; old != nil {
		if old == nu {
			return nil
		}
		g.claims = g.claims.minus(old.total, m.counts)
	}
	g.claims = g.claims.plus(nu.total, m.counts)
	g.counted[ns] = nu
	return nil
}

// usageOf is what tenant holds (its namespaces' claims plus the
// reservations in held that still count) and what its cohort's other
// members hold idle. The pass over held also brings the cohort's reserved
// sum up to date (holdLocked).
func (a *Accountant) usageOf(ctx context.Context, cat *priceList, ten *tenancy, tenant string, held []reservation) (quota.Usage, quota.PeersIdle, error) {
	t := ten.tenants[tenant]
	g := a.cohortFor(ten, t)
	g.mu.Lock()
	defer g.mu.Unlock()
	if err := a.syncLocked(ctx, cat, ten, g, bookOwner(t)); err != nil {
		return quota.Usage{}, quota.PeersIdle{}, err
	}
	var tally quota.Tally
	a.holdLocked(ctx, g, held, tenant, &tally)
	for _, ns := range ten.assign.Namespaces[tenant] {
		tally.AddUsage(g.counted[ns].usage)
	}
	usage := tally.Usage()
	idle := g.limits.minus(g.claims, bothDims).minus(g.held, bothDims)
	if m := g.members[tenant]; m != nil { // the tenant's own idle is not its peers'
		idle = idle.minus(m.limits, m.counts).plus(dimsOf(usage.Total()), m.counts)
	}
	return usage, quota.PeersIdle{Units: idle[0], Memory: idle[1]}, nil
}

// holdLocked makes g's reserved sum that of the reservations in held that
// count (reservation.go), as g's counts of the namespaces show the claims,
// and adds tenant's to tally (caller holds g.mu). Only reservations that
// start or stop counting, or change, cost arithmetic.
func (a *Accountant) holdLocked(ctx context.Context, g *cohortUsage, held []reservation, tenant string, tally *quota.Tally) {
	a.claimsMu.Lock()
	defer a.claimsMu.Unlock()
	view := a.viewLocked(g.counted)
	now := a.now()
	// This pass's entries go into the map the last pass emptied: a book
	// holds hundreds of reservations at 200 claims/s, and a fresh map per
	// admission was most of what a decision allocated.
	next := g.spare
	if next == nil {
		next = make(map[string]*heldEntry, len(g.reserved))
	}
	for _, r := range held {
		m := g.owner[r.Namespace]
		if m == nil || !r.countsFor(r.phase(view, now), m.tenant.Name, tenant) {
			continue
		}
		if e := g.hold(ctx, next, r, m); e != nil && m.tenant.Name == tenant {
			tally.Add(e.charge, false)
		}
	}
	for k, e := range g.reserved {
		if next[k] != e { // stopped counting, or changed
			g.held = g.held.minus(e.dims, e.member.counts)
		}
	}
	clear(g.reserved)
	g.reserved, g.spare = next, g.reserved
}

// hold counts r in next, this pass's reservations, carrying its entry over
// from the last pass when it is unchanged and adding it to the sum when it
// is new; nil for a damaged one.
func (g *cohortUsage) hold(ctx context.Context, next map[string]*heldEntry, r reservation, m *cohortMember) *heldEntry {
	key := string(r.UID)
	for next[key] != nil { // the same UID twice in a book: counted twice, as entries
		key += "\x00"
	}
	e := g.reserved[key]
	if e != nil && e.member == m && e.r.Units == r.Units && e.r.Memory == r.Memory && maps.Equal(e.r.Devices, r.Devices) {
		next[key] = e
		return e
	}
	c, err := r.charge()
	if err != nil {
		klog.FromContext(ctx).Error(err, "Ignoring a damaged reservation")
		return nil
	}
	e = &heldEntry{r: r, member: m, charge: c, dims: dimsOf(c)}
	next[key] = e
	g.held = g.held.plus(e.dims, m.counts)
	return e
}
