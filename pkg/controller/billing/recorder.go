package billing

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/big"
	"slices"
	"sort"
	"sync"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/quota"
)

// Meter says what a claim holds: the tenant its namespace is charged to
// ("" for none: not billed) and each device of ours it holds.
// admission.Accountant.Holdings is one.
type Meter interface {
	Holdings(ctx context.Context, claim *resourceapi.ResourceClaim) (string, []quota.Held, error)
}

// Recorder keeps the usage records. Every Reconcile compares all allocated
// claims with the open records (one request key: events coalesce), then
// writes the TenantUsages that changed.
type Recorder struct {
	// Client reads claims, GpuProfiles and GpuShapes (the manager's cache)
	// and writes TenantUsages.
	Client client.Client
	// Live reads the TenantUsages once, when this leader starts.
	Live     client.Reader
	Meter    Meter
	Currency string
	// Resync is how often lastSeen is checkpointed without changes.
	Resync time.Duration
	Now    func() time.Time
	// Shapes: GpuShapes are served (and so priced).
	Shapes bool
	// Events raises the budgets' threshold events (nil: none).
	Events events.EventRecorder
	// RetentionMonths: a TenantUsage is deleted once its month ended more
	// than this many months before the current one began (never the
	// current or the previous month); 0 keeps them all (retention.go).
	RetentionMonths int

	mu     sync.Mutex
	loaded bool
	// usages are the records as this leader knows them, by name: what the
	// API has, or will have once a failed write is retried.
	usages map[string]*gpuaas.TenantUsage
	dirty  map[string]bool
	// seen are the open records this process observed allocated: one it
	// no longer sees ended now; one it never saw (a previous leader's)
	// ended at its lastSeen, uncertain.
	seen map[string]bool
	// budgets are the tenants' budgets the last sync saw (budget.go).
	budgets map[string]budgetState
	// idle are the GPU units, and their cost per hour, that each tenant's
	// claims held on devices the plugin reports Idle=True at the last
	// reconcile (idle.go).
	idle map[string]idleHeld
	// retired are the deleted TenantUsages' totals, still counted, and
	// deleted how many per tenant (retention.go).
	retired map[costKey]retiredUsage
	deleted map[string]int64
}

// observation is one device a claim holds now, as it would be recorded,
// and its use as the claim's status says (use.go).
type observation struct {
	rec   gpuaas.UsageRecord
	use   gpuaas.DeviceUse
	since time.Time
}

// useNow is the observation's use, watched when this leader saw the
// record up to its lastSeen.
func (o observation) useNow(watched bool) *useObs {
	return &useObs{use: o.use, since: o.since, watched: watched}
}

// budgetBehindRetry is how soon a reconcile whose budget status write met
// another writer's newer status every time comes back.
const budgetBehindRetry = time.Second

// Reconcile brings the records up to date with the claims.
func (r *Recorder) Reconcile(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.load(ctx); err != nil {
		return reconcile.Result{}, err
	}
	now := r.now()
	observed, err := r.observe(ctx, now)
	if err != nil {
		return reconcile.Result{}, err
	}
	r.apply(ctx, observed, now)
	// The budgets are judged on the records as this leader knows them,
	// written or still to be.
	behind, budgetErr := r.syncBudgets(ctx, now)
	err = errors.Join(r.flush(ctx), budgetErr)
	// After the flush: only what is written is deleted.
	if err := errors.Join(err, r.retire(ctx, now)); err != nil {
		// Kept in memory: the next try writes what is new since too.
		return reconcile.Result{}, err
	}
	if behind {
		return reconcile.Result{RequeueAfter: min(budgetBehindRetry, r.Resync)}, nil
	}
	return reconcile.Result{RequeueAfter: r.Resync}, nil
}

func (r *Recorder) now() time.Time { return r.Now().UTC().Truncate(time.Second) }

// load reads the TenantUsages from the API once (a previous leader's
// records), before anything is recorded.
func (r *Recorder) load(ctx context.Context) error {
	if r.loaded {
		return nil
	}
	var list gpuaas.TenantUsageList
	if err := r.Live.List(ctx, &list); err != nil {
		return fmt.Errorf("reading the TenantUsages: %w", err)
	}
	r.usages, r.dirty, r.seen = map[string]*gpuaas.TenantUsage{}, map[string]bool{}, map[string]bool{}
	for i := range list.Items {
		r.usages[list.Items[i].Name] = list.Items[i].DeepCopy()
	}
	r.loaded = true
	klog.FromContext(ctx).V(2).Info("Billing starts from the recorded usage", "tenantUsages", len(list.Items))
	return nil
}

// observe lists the devices the allocated claims hold now, with the price
// that applies.
func (r *Recorder) observe(ctx context.Context, now time.Time) (map[string]observation, error) {
	prices, err := r.prices(ctx)
	if err != nil {
		return nil, err
	}
	var claims resourceapi.ResourceClaimList
	if err := r.Client.List(ctx, &claims); err != nil {
		return nil, fmt.Errorf("listing ResourceClaims: %w", err)
	}
	out := map[string]observation{}
	idle := map[string]idleHeld{}
	for i := range claims.Items {
		claim := &claims.Items[i]
		if claim.Status.Allocation == nil {
			continue
		}
		tenant, held, err := r.Meter.Holdings(ctx, claim)
		if err != nil {
			return nil, fmt.Errorf("pricing claim %s/%s: %w", claim.Namespace, claim.Name, err)
		}
		if tenant == "" {
			continue
		}
		if _, ok := idle[tenant]; !ok { // "none idle" is a value, not an absent series
			idle[tenant] = idleHeld{units: new(big.Rat), costPerHour: new(big.Rat)}
		}
		for _, h := range held {
			use, since := deviceUse(claim, h.Device)
			rec := recordOf(claim, tenant, h, prices, now)
			rec.Use, rec.UseSince = use, ptrTime(now)
			out[recordKey(&rec)] = observation{rec: rec, use: use, since: since}
			if use == gpuaas.DeviceIdle {
				addIdle(idle, &rec)
			}
		}
	}
	r.idle = idle
	return out, nil
}

// priceBook is the price per GPU-unit-hour of each priced profile and shape.
type priceBook struct{ profiles, shapes map[string]resource.Quantity }

func (r *Recorder) prices(ctx context.Context) (priceBook, error) {
	book := priceBook{profiles: map[string]resource.Quantity{}, shapes: map[string]resource.Quantity{}}
	var profiles gpuaas.GpuProfileList
	if err := r.Client.List(ctx, &profiles); err != nil {
		return book, fmt.Errorf("listing GpuProfiles: %w", err)
	}
	for _, p := range profiles.Items {
		if price, ok := validPrice(ctx, "GpuProfile", p.Name, p.Spec.Price); ok {
			book.profiles[p.Name] = price
		}
	}
	if !r.Shapes {
		return book, nil
	}
	var shapes gpuaas.GpuShapeList
	if err := r.Client.List(ctx, &shapes); err != nil {
		return book, fmt.Errorf("listing GpuShapes: %w", err)
	}
	for _, s := range shapes.Items {
		if price, ok := validPrice(ctx, "GpuShape", s.Name, s.Spec.Price); ok {
			book.shapes[s.Name] = price
		}
	}
	return book, nil
}

// validPrice is a set price that is not negative (a negative one would
// make the cost counters go down): one is ignored, billed at zero, and
// logged.
func validPrice(ctx context.Context, kind, name string, p *gpuaas.Price) (resource.Quantity, bool) {
	if p == nil {
		return resource.Quantity{}, false
	}
	if p.PerGpuUnitHour.Sign() < 0 {
		klog.FromContext(ctx).Error(nil, "Ignoring a negative price: billed at zero", "kind", kind, "name", name, "perGpuUnitHour", p.PerGpuUnitHour.String())
		return resource.Quantity{}, false
	}
	return p.PerGpuUnitHour, true
}

// recordOf is the open record of a device a claim holds: priced by the
// claim's shape when the shape has a price, else by the request's profile.
func recordOf(claim *resourceapi.ResourceClaim, tenant string, h quota.Held, prices priceBook, now time.Time) gpuaas.UsageRecord {
	rec := gpuaas.UsageRecord{Tenant: tenant, Namespace: claim.Namespace, Claim: claim.Name, ClaimUID: claim.UID,
		Device: h.Device.Pool + "/" + h.Device.Device, Profile: h.Class, GpuModel: h.Model, Node: h.Device.Pool,
		Units: h.Charge.Units.Exact(), Memory: *resource.NewQuantity(h.Charge.Memory, resource.BinarySI),
		Start: metav1.NewTime(now), LastSeen: metav1.NewTime(now)}
	for _, ref := range claim.Status.ReservedFor {
		if ref.Resource == "pods" && len(rec.Pods) < maxPods {
			rec.Pods = append(rec.Pods, ref.Name)
		}
	}
	sort.Strings(rec.Pods)
	if p, ok := prices.profiles[h.Class]; ok {
		rec.Price = p
	}
	for _, shape := range slices.Sorted(maps.Keys(h.Shapes)) {
		if p, ok := prices.shapes[shape]; ok {
			rec.Shape, rec.Price = shape, p
			break
		}
	}
	return rec
}

// apply closes the open records whose allocation went, splits those whose
// price (or units) changed or whose month ended, checkpoints the others'
// lastSeen and opens records for the new allocations.
func (r *Recorder) apply(ctx context.Context, observed map[string]observation, now time.Time) {
	logger := klog.FromContext(ctx)
	for name, u := range r.usages {
		for i := len(u.Status.Open) - 1; i >= 0; i-- {
			rec := &u.Status.Open[i]
			key := recordKey(rec)
			obs, held := observed[key]
			switch {
			case !held && r.seen[key]:
				r.closeAcrossPeriods(u, i, now, nil, nil)
				delete(r.seen, key)
			case !held:
				// It went while no leader ran: billed up to what was
				// observed, the window said.
				logger.V(1).Info("Closing a record at its last observation: the allocation went while no leader ran",
					"tenantUsage", name, "claim", rec.Namespace+"/"+rec.Claim, "device", rec.Device, "lastSeen", rec.LastSeen.Time)
				r.closeAcrossPeriods(u, i, rec.LastSeen.Time, &now, nil)
			case !sameTerms(rec, &obs.rec):
				r.closeAcrossPeriods(u, i, now, nil, obs.useNow(r.seen[key]))
				continue // reopened below, at the new terms
			case !now.Before(u.Spec.End.Time):
				r.rollOver(u, i, obs, now)
				continue
			default:
				// accountUse moves lastSeen, never back: a new leader's
				// clock behind the last checkpoint would count that span
				// twice.
				accountUse(rec, *obs.useNow(r.seen[key]), now)
				rec.Pods = obs.rec.Pods
				r.seen[key] = true
				delete(observed, key)
				continue
			}
			r.dirty[name] = true
		}
	}
	open := r.openKeys()
	for key, obs := range observed {
		if open[key] {
			continue // reopened at the period's start above
		}
		r.openRecord(obs.rec)
	}
	for key := range observed {
		r.seen[key] = true
	}
	r.advanceOpen(now)
	for name, u := range r.usages {
		summarize(u)
		if len(u.Status.Open) > 0 {
			r.dirty[name] = true // the lastSeen checkpoint
		}
	}
}

// rollOver closes the open record at index i of u at the end of its
// period (its month) and opens its successor there, accounted up to now
// (or up to its own period's end: advanceOpen, the next reconcile).
func (r *Recorder) rollOver(u *gpuaas.TenantUsage, i int, obs observation, now time.Time) {
	end := u.Spec.End.Time
	use := obs.useNow(r.seen[recordKey(&u.Status.Open[i])])
	last := r.closeAcrossPeriods(u, i, end, nil, use)
	next := obs.rec
	next.Start, next.LastSeen = metav1.NewTime(end), metav1.NewTime(end)
	next.Use, next.UseSince = last.Use, ptrTime(end)
	_, _, nextEnd := Period(end)
	accountUse(&next, *use, earlier(now, nextEnd))
	r.openRecord(next)
}

func earlier(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// advanceOpen brings lastSeen of the records opened at a past period's
// start (month rollover) up to now, or their period's end (closed at the
// next reconcile), their use going on as last accounted.
func (r *Recorder) advanceOpen(now time.Time) {
	for _, u := range r.usages {
		for i := range u.Status.Open {
			rec := &u.Status.Open[i]
			if r.seen[recordKey(rec)] && rec.LastSeen.Before(ptrTime(now)) {
				accountUse(rec, going(rec), earlier(now, u.Spec.End.Time))
			}
		}
	}
}

// openKeys are the open records' keys.
func (r *Recorder) openKeys() map[string]bool {
	out := map[string]bool{}
	for _, u := range r.usages {
		for i := range u.Status.Open {
			out[recordKey(&u.Status.Open[i])] = true
		}
	}
	return out
}

// sameTerms: the record goes on at the same price and units.
func sameTerms(rec, now *gpuaas.UsageRecord) bool {
	return rec.Price.Cmp(now.Price) == 0 && rec.Units == now.Units && rec.Profile == now.Profile && rec.Shape == now.Shape
}

// openRecord adds a record to its tenant's TenantUsage of the period of
// its start.
func (r *Recorder) openRecord(rec gpuaas.UsageRecord) {
	u := r.usageOf(rec.Tenant, rec.Start.Time)
	settle(&rec)
	u.Status.Open = append(u.Status.Open, rec)
	r.dirty[u.Name] = true
}

// closeAcrossPeriods closes an open record at end, its use as obs says
// (nil: as last accounted); the part of it past its period's end goes to
// the next period's TenantUsage, closed there. It returns the last part
// closed.
func (r *Recorder) closeAcrossPeriods(u *gpuaas.TenantUsage, i int, end time.Time, uncertainUntil *time.Time, obs *useObs) gpuaas.UsageRecord {
	rec := u.Status.Open[i]
	r.dirty[u.Name] = true
	periodEnd := u.Spec.End.Time
	if !end.After(periodEnd) {
		return closeRecord(u, i, end, uncertainUntil, obs)
	}
	closed := closeRecord(u, i, periodEnd, nil, obs)
	rest := rec
	rest.Start, rest.LastSeen, rest.End = metav1.NewTime(periodEnd), metav1.NewTime(periodEnd), nil
	rest.UsedUnitSeconds, rest.IdleUnitSeconds = "", ""
	rest.Use, rest.UseSince = closed.Use, ptrTime(periodEnd)
	r.openRecord(rest)
	next := r.usageOf(rec.Tenant, periodEnd)
	return r.closeAcrossPeriods(next, len(next.Status.Open)-1, end, uncertainUntil, obs)
}

func (r *Recorder) usageOf(tenant string, at time.Time) *gpuaas.TenantUsage {
	period, _, _ := Period(at)
	name := UsageName(tenant, period)
	u, ok := r.usages[name]
	if !ok {
		u = newUsage(tenant, at, r.Currency)
		r.usages[name] = u
	}
	return u
}

// flush writes the TenantUsages that changed; those that fail stay dirty.
func (r *Recorder) flush(ctx context.Context) error {
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(r.dirty)) {
		if err := r.write(ctx, r.usages[name]); err != nil {
			errs = append(errs, err)
			continue
		}
		delete(r.dirty, name)
	}
	return errors.Join(errs...)
}

// write creates a TenantUsage (then its status) or updates its status. A
// conflict means a write this leader thought failed went through (or the
// object was recreated): the next try writes over the live version.
func (r *Recorder) write(ctx context.Context, u *gpuaas.TenantUsage) error {
	if u.ResourceVersion == "" {
		obj := &gpuaas.TenantUsage{ObjectMeta: metav1.ObjectMeta{Name: u.Name}, Spec: u.Spec}
		err := r.Client.Create(ctx, obj)
		if apierrors.IsAlreadyExists(err) {
			err = r.Client.Get(ctx, client.ObjectKey{Name: u.Name}, obj)
		}
		if err != nil {
			return fmt.Errorf("creating TenantUsage %s: %w", u.Name, err)
		}
		u.ResourceVersion = obj.ResourceVersion
	}
	obj := u.DeepCopy()
	err := r.Client.Status().Update(ctx, obj)
	if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
		r.refreshVersion(ctx, u)
	}
	if err != nil {
		return fmt.Errorf("writing TenantUsage %s: %w", u.Name, err)
	}
	u.ResourceVersion = obj.ResourceVersion
	return nil
}

func (r *Recorder) refreshVersion(ctx context.Context, u *gpuaas.TenantUsage) {
	var live gpuaas.TenantUsage
	err := r.Live.Get(ctx, client.ObjectKey{Name: u.Name}, &live)
	switch {
	case err == nil:
		u.ResourceVersion = live.ResourceVersion
	case apierrors.IsNotFound(err):
		u.ResourceVersion = "" // deleted: created again
	}
}

// Snapshot is a copy of the records as this leader knows them.
func (r *Recorder) Snapshot() []gpuaas.TenantUsage {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]gpuaas.TenantUsage, 0, len(r.usages))
	for _, name := range slices.Sorted(maps.Keys(r.usages)) {
		out = append(out, *r.usages[name].DeepCopy())
	}
	return out
}
