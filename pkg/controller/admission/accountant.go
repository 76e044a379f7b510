package admission

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/deviceclass"
	"github.com/gpuaas/gpu-dra-driver/pkg/quota"
)

// Accountant is what the webhook and the reconcilers share: a pricing
// snapshot of the catalog (slices, classes, profiles), the tenancy (quotas
// and namespaces), a cache of claim charges, and the claims admitted but
// not yet in the informer cache, which the ledger shares with the other
// replicas. Everything it reports is computed from API objects; the
// in-memory parts only save work.
type Accountant struct {
	reader    client.Reader // the informer cache
	apiReader client.Reader // live reads, for a namespace the cache has not seen yet
	ledger    *Ledger
	// DenyUnassigned: see Options.
	DenyUnassigned bool
	// ReclaimAfter: see Options.ReclaimUnallocatedAfter; zero: lenders wait.
	ReclaimAfter time.Duration
	// ReclaimEvents, when set, records on each claim deleted to give a
	// lender its quota back why it went.
	ReclaimEvents events.EventRecorder
	// pricingSlots bound the new request shapes the accountant's pricers
	// evaluate at once (see SetPricingSlots).
	pricingSlots *quota.PricingSlots
	// recountBudget bounds the CEL cost of pricing the claims of one
	// cohort sync (syncLocked); quota.MaxCELCostPerClaim, so that any
	// claim admitted within its own budget can be priced in one sync.
	recountBudget int64
	// legacyRecount, set by a benchmark only, prices a recount's claims as
	// before issue 55's fix, for its "before": under claimsMu, with no
	// budget but the caller's deadline.
	legacyRecount bool

	// Locks. Four guard the books' running totals, each for a reason of
	// its own; none is held across an API call, and they nest only in the
	// order cohortUsage.mu, claimsMu, nsMu (mu is never held with another
	// but nsMu):
	//
	//  - cohortUsage.mu, one per book owner (cohort.go), held by a decision
	//    from sync to verdict: what one decides depends on the others of
	//    its cohort, and on nothing of another cohort, so tenants of
	//    different cohorts never wait for each other.
	//  - mu guards the snapshots and the map of running totals; it is held
	//    for moments only, but across a snapshot's rebuild.
	//  - claimsMu guards what is known of the claims (their prices, the
	//    namespaces' counts, the deletions), which the running totals of
	//    different cohorts share: a namespace moves between cohorts when a
	//    quota changes, and its claims need not be priced again. It is held
	//    while claims are priced (CEL), so it is not mu.
	//  - nsMu guards what the informer handlers report, which must not wait
	//    for a pricing under claimsMu: the claim generations and the dirty
	//    namespaces, and the live reads of namespaces the cache has not
	//    seen yet. It is a leaf: held for map operations only.
	//
	// Generation counters: catalogGen and tenancyGen, bumped by the
	// informers, tell when a snapshot (and the running totals built on it)
	// is stale; nsGen, per namespace, tells when a namespace's count is.
	// Which reservations a total holds needs none: each decision's pass
	// over the book recomputes it (holdLocked).
	catalogGen, tenancyGen atomic.Int64
	// countShapes: the GpuShape CRD is served and watched (WatchShapes),
	// so the catalog lists shapes and claims are charged their instances.
	countShapes atomic.Bool

	mu  sync.Mutex
	cat *priceList
	ten *tenancy
	// cohorts are the running totals of the book owners (cohort.go), for
	// the tenancy generation cohortsGen.
	cohorts    map[string]*cohortUsage
	cohortsGen int64
	now        func() time.Time

	claimsMu sync.Mutex
	charges  map[types.UID]cachedCharge
	nsUsage  map[string]*namespaceUsage
	// gone remembers deleted claims for reservationGrace: a reservation
	// of a claim this cache saw come and go holds nothing.
	gone      map[types.UID]time.Time
	lastSweep time.Time

	nsMu sync.Mutex
	// nsGen and nsDirty: the claim generations, and the namespaces whose
	// claims changed since a running total counted them.
	nsGen    map[string]int64
	nsDirty  map[string]struct{}
	tracking bool
	// live: namespaces the cache had not seen when a claim in them
	// arrived, read from the API before taking mu (a live read under mu
	// stalled every admission of every tenant behind it).
	live map[string]liveNamespace

	// beforePricing, when set (by tests), is called before a claim of the
	// cache is priced: a test holds a pricing with it.
	beforePricing func(ctx context.Context, claim *resourceapi.ResourceClaim)

	// progress is how far the ResourceClaim cache has got; a book another
	// replica settled further is not decided on before it gets there.
	progress *claimProgress
}

// priceList is the catalog as the accountant prices claims: a snapshot of
// the slices, classes and profiles.
type priceList struct {
	gen int64
	// pools is what each pool of ours was built from (poolKey), and
	// classes what the classes, profiles and shapes were (classesKey):
	// an allocated claim's charge reads only its devices' pools and those,
	// so it stays valid across generations that changed neither (issue 52).
	pools    map[string]string
	classes  string
	pricer   *quota.Pricer
	profiles map[string]*gpuaas.GpuProfile
	migs     map[string]bool // MIG profile names published by nodes
}

// NewAccountant reads objects from reader (the manager's cache) and, for
// namespaces the cache misses, from apiReader; it reserves admitted claims
// in ledger.
func NewAccountant(reader, apiReader client.Reader, ledger *Ledger) *Accountant {
	a := &Accountant{
		reader: reader, apiReader: apiReader, ledger: ledger,
		charges: map[types.UID]cachedCharge{},
		nsUsage: map[string]*namespaceUsage{},
		nsGen:   map[string]int64{},
		nsDirty: map[string]struct{}{},
		cohorts: map[string]*cohortUsage{},
		gone:    map[types.UID]time.Time{},
		live:    map[string]liveNamespace{},
		now:     time.Now,

		pricingSlots:  quota.DefaultPricingSlots(),
		recountBudget: quota.MaxCELCostPerClaim,

		progress: newClaimProgress(),
	}
	a.catalogGen.Store(1)
	a.tenancyGen.Store(1)
	return a
}

// InvalidateCatalog is called when slices, classes or profiles change.
func (a *Accountant) InvalidateCatalog() { a.catalogGen.Add(1) }

// invalidateTenancy is called when quotas or namespaces change.
func (a *Accountant) invalidateTenancy() { a.tenancyGen.Add(1) }

// forgetClaim drops the cached charge of a deleted claim and remembers
// that it is gone.
func (a *Accountant) forgetClaim(uid types.UID) {
	a.claimsMu.Lock()
	defer a.claimsMu.Unlock()
	delete(a.charges, uid)
	now := a.now()
	a.gone[uid] = now
	if now.Sub(a.lastSweep) > reservationGrace {
		for u, at := range a.gone {
			if now.Sub(at) > reservationGrace {
				delete(a.gone, u)
			}
		}
		a.lastSweep = now
	}
}

// observeClaimVersion is called by the claim informer with the
// resourceVersion of every event it delivered (and, once synced, of its
// list): the cache holds every claim up to it.
func (a *Accountant) observeClaimVersion(rv string) { a.progress.observe(rv) }

// snapshots are the catalog and the tenancy, rebuilt where they changed.
func (a *Accountant) snapshots(ctx context.Context) (*priceList, *tenancy, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	cat, err := a.catalogLocked(ctx)
	if err != nil {
		return nil, nil, err
	}
	ten, err := a.tenancyLocked(ctx)
	return cat, ten, err
}

func (a *Accountant) catalogLocked(ctx context.Context) (*priceList, error) {
	gen := a.catalogGen.Load() // before listing: a change during the list rebuilds again
	if a.cat != nil && a.cat.gen == gen {
		return a.cat, nil
	}
	var slices resourceapi.ResourceSliceList
	if err := a.reader.List(ctx, &slices, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("listing ResourceSlices: %w", err)
	}
	var classes resourceapi.DeviceClassList
	if err := a.reader.List(ctx, &classes, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("listing DeviceClasses: %w", err)
	}
	var profiles gpuaas.GpuProfileList
	if err := a.reader.List(ctx, &profiles, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("listing GpuProfiles: %w", err)
	}
	var shapes gpuaas.GpuShapeList
	if a.countShapes.Load() {
		if err := a.reader.List(ctx, &shapes, client.UnsafeDisableDeepCopy); err != nil {
			return nil, fmt.Errorf("listing GpuShapes: %w", err)
		}
	}
	a.cat = newCatalog(gen, slices.Items, classes.Items, profiles.Items)
	a.cat.pricer.WithShapes(shapesOf(shapes.Items)).WithSlots(a.pricingSlots)
	a.cat.pools, a.cat.classes = poolKeys(slices.Items), classesKey(classes.Items, profiles.Items, shapes.Items, a.countShapes.Load())
	return a.cat, nil
}

func newCatalog(gen int64, slices []resourceapi.ResourceSlice, classes []resourceapi.DeviceClass, profiles []gpuaas.GpuProfile) *priceList {
	cat := &priceList{gen: gen, profiles: map[string]*gpuaas.GpuProfile{}, migs: map[string]bool{}}
	sl := make([]*resourceapi.ResourceSlice, 0, len(slices))
	for i := range slices {
		sl = append(sl, &slices[i])
	}
	inv := quota.NewInventory(quota.DriverName, sl)
	for _, d := range inv.Devices() {
		if p, ok := d.Basic.Attributes[quota.AttrProfile]; ok && d.Type == quota.TypeMIG && p.StringValue != nil {
			cat.migs[*p.StringValue] = true
		}
	}
	byName := make(map[string]*resourceapi.DeviceClass, len(classes))
	for i := range classes {
		byName[classes[i].Name] = &classes[i]
	}
	names := make(map[string]bool, len(profiles))
	for i := range profiles {
		p := &profiles[i]
		cat.profiles[p.Name] = p
		names[p.Name] = true
		// A profile whose class is not rendered yet (created a moment
		// ago) is priced by what its class will select, not guessed.
		if _, ok := byName[p.Name]; !ok && p.IsEnabled() {
			if dc, err := deviceclass.Build(p, cat.migs); err == nil {
				byName[p.Name] = dc
			}
		}
	}
	cat.pricer = quota.NewPricer(inv, byName, names)
	return cat
}

// reserve is the book after admitting claim: the new reservation, minus
// those that hold nothing any more and those every replica has surely
// seen resolved; full (the book is left as it was) explains a refusal when
// the new reservation would take the tenant's or the book's size past its
// cap (see maxBookBytes).
//
// Which reservations the book keeps is the reservation rule's
// (reservation.go): lapsed ones go, and so do settled ones, whose claims'
// resourceVersions the book's settled version then covers, so that a
// replica whose cache lags waits for it before deciding
// (cacheprogress.go).
//
// A claim name holds at most one reservation. A create fails with
// AlreadyExists when the name is taken, after the webhook reserved it, so
// every re-run of a create held its cost until reservationGrace with
// nothing in the API, and filled the book; but of the creates of one name
// at most one object exists at a time, so one reservation worth the dearer
// of each resource covers them all (phase.carriesOver).
func (a *Accountant) reserve(held bookState, claim *resourceapi.ResourceClaim, cost quota.Charge, tenant string) (_ bookState, full string) {
	owner := a.owners()
	a.claimsMu.Lock()
	defer a.claimsMu.Unlock()
	now := a.now()
	key := types.NamespacedName{Namespace: claim.Namespace, Name: claim.Name}
	next := bookState{entries: make([]reservation, 0, len(held.entries)+1), settled: held.settled}
	var bookBytes, tenantBytes int
	view := a.viewLocked(a.nsUsage)
	for _, r := range held.entries {
		if r.UID == claim.UID {
			continue
		}
		p := r.phase(view, now)
		if p == lapsed {
			continue
		}
		if rv, ok := r.settled(p, view, now); ok {
			next.settled = laterVersion(rv, next.settled)
			continue
		}
		if r.key() == key { // replaced by the new reservation
			if c, err := r.charge(); err == nil && p.carriesOver() {
				cost = cost.Max(c)
			}
			continue
		}
		n := r.sizeBound()
		bookBytes += n
		if owner[r.Namespace] == tenant {
			tenantBytes += n
		}
		next.entries = append(next.entries, r)
	}
	nr := newReservation(key, claim.UID, cost, now)
	n := nr.sizeBound()
	switch {
	case tenantBytes+n > maxTenantBookBytes:
		return held, fmt.Sprintf("TenantQuota %q has too many claims admitted whose creates are not yet seen (%d bytes of reservations, at most %d): "+
			"retry in a few seconds, when they are created or expire", tenant, tenantBytes, maxTenantBookBytes)
	case bookBytes+n > maxBookBytes:
		return held, fmt.Sprintf("the quota ledger of TenantQuota %q (its cohort's, if any) has too many claims admitted whose creates are not yet seen (%d bytes of reservations, at most %d): "+
			"retry in a few seconds, when they are created or expire", tenant, bookBytes, maxBookBytes)
	}
	next.entries = append(next.entries, nr)
	return next, ""
}

// cacheView is what this replica's cache shows of claims, for the
// reservation rule (reservation.go): the namespaces' claims as counted in
// counted, and the claims seen deleted. Its holder holds claimsMu.
type cacheView struct {
	counted map[string]*namespaceUsage
	gone    map[types.UID]time.Time
	charges map[types.UID]cachedCharge
}

// viewLocked is the cache as counted in counted (caller holds claimsMu):
// the latest count of each namespace (a.nsUsage), or a running total's
// (cohortUsage.counted), so that a reservation stops counting exactly when
// the claim the total counts starts.
//
// It is returned as the interface the rule takes, made once per pass: a
// cacheView converted at each of the pass's calls would be allocated at
// each (hundreds per admission at 200 claims/s).
func (a *Accountant) viewLocked(counted map[string]*namespaceUsage) claimView {
	return &cacheView{counted: counted, gone: a.gone, charges: a.charges}
}

func (v *cacheView) named(key types.NamespacedName) (types.UID, string, bool) {
	nu := v.counted[key.Namespace]
	if nu == nil {
		return "", "", false
	}
	uid, ok := nu.claims[key]
	return uid, nu.versions[uid], ok
}

func (v *cacheView) sawDeleted(uid types.UID) bool {
	_, ok := v.gone[uid]
	return ok
}

func (v *cacheView) costOf(uid types.UID) quota.Charge { return v.charges[uid].charged.Charge }

// owners is which quota each namespace is charged to, as of the last
// tenancy snapshot.
func (a *Accountant) owners() map[string]string {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.ten == nil {
		return nil
	}
	return a.ten.owner
}

// heldFor is what this replica last read of the book a quota is charged in.
func (a *Accountant) heldFor(ctx context.Context, name string) []reservation {
	a.mu.Lock()
	ten, err := a.tenancyLocked(ctx)
	a.mu.Unlock()
	if err != nil {
		return nil
	}
	t, ok := ten.tenants[name]
	if !ok {
		return nil
	}
	return a.ledger.bookFor(t).snapshot().entries
}

// namespaceUsage is what the claims of one namespace hold, as of the
// namespace's claim generation and the catalog generation.
type namespaceUsage struct {
	claimGen, catalogGen int64
	usage                quota.Usage
	total                dimVals                            // of usage.Total(), for the running totals
	claims               map[types.NamespacedName]types.UID // what was counted
	versions             map[types.UID]string               // their resourceVersions, as counted
	// provisional: some claim's pricing was cut short and counts at its
	// worst case; recounted on next use.
	provisional bool
}

// ClaimChanged is called by the claim informer for every event: the
// namespace's sum is recomputed on its next use. Until the first call the
// accountant cannot know when a namespace changed and recomputes always.
func (a *Accountant) ClaimChanged(namespace string) {
	a.nsMu.Lock()
	a.nsGen[namespace]++
	a.nsDirty[namespace] = struct{}{}
	a.tracking = true
	a.nsMu.Unlock()
}

func (a *Accountant) claimGen(namespace string) (int64, bool) {
	a.nsMu.Lock()
	defer a.nsMu.Unlock()
	return a.nsGen[namespace], a.tracking
}

// namespaceUsage is the namespace's sum, recounted when its claims or the
// catalog changed, or when its last count was provisional. Neither the
// cache's list nor the pricing of claims whose charges are not cached holds
// claimsMu: a slow list, or a tenant's claims slow to price, must not hold
// up the other cohorts' decisions. A claim whose pricing ctx's budget cut
// short counts at its worst case, and the count is provisional: the next
// recount prices on from there (the charges that were complete are kept).
func (a *Accountant) namespaceUsage(ctx, pctx context.Context, cat *priceList, ns string) (*namespaceUsage, error) {
	gen, tracking := a.claimGen(ns)
	a.claimsMu.Lock()
	nu := a.nsUsage[ns]
	a.claimsMu.Unlock()
	if tracking && nu != nil && !nu.provisional && nu.claimGen == gen && nu.catalogGen == cat.gen {
		return nu, nil
	}
	var claims resourceapi.ResourceClaimList
	if err := a.reader.List(ctx, &claims, client.InNamespace(ns), client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("listing ResourceClaims of namespace %s: %w", ns, err)
	}
	charges := make([]quota.Charged, len(claims.Items))
	var unknown []int
	a.claimsMu.Lock()
	for i := range claims.Items {
		var ok bool
		if charges[i], ok = a.cachedChargeLocked(cat, &claims.Items[i]); !ok {
			unknown = append(unknown, i)
		}
	}
	a.claimsMu.Unlock()
	nu = &namespaceUsage{claimGen: gen, catalogGen: cat.gen,
		claims:   make(map[types.NamespacedName]types.UID, len(claims.Items)),
		versions: make(map[types.UID]string, len(claims.Items))}
	complete := make([]bool, len(unknown))
	if a.legacyRecount {
		a.claimsMu.Lock()
	}
	for j, i := range unknown {
		charges[i], complete[j] = a.priceClaim(pctx, cat, &claims.Items[i])
		nu.provisional = nu.provisional || !complete[j]
	}
	if !a.legacyRecount {
		a.claimsMu.Lock()
	}
	defer a.claimsMu.Unlock()
	for j, i := range unknown {
		if complete[j] {
			a.rememberChargeLocked(cat, &claims.Items[i], charges[i])
		}
	}
	var tally quota.Tally
	for i := range claims.Items {
		c := &claims.Items[i]
		nu.claims[types.NamespacedName{Namespace: c.Namespace, Name: c.Name}] = c.UID
		nu.versions[c.UID] = c.ResourceVersion
		if ch := charges[i]; !ch.Charge.IsZero() {
			tally.Add(ch.Charge, ch.Allocated)
		}
	}
	nu.usage = tally.Usage()
	nu.total = dimsOf(nu.usage.Total())
	a.nsUsage[ns] = nu
	return nu, nil
}
