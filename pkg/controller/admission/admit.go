package admission

import (
	"context"
	"fmt"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpuaas/gpu-dra-driver/pkg/controller/catalog"
	"github.com/gpuaas/gpu-dra-driver/pkg/posture"
	"github.com/gpuaas/gpu-dra-driver/pkg/quota"
)

// Admission is the outcome of charging a new claim.
type Admission struct {
	quota.Decision
	// Tenant is the TenantQuota charged ("" when none covers the namespace).
	Tenant string
	// Cohort of the tenant, for the warning on a borrowing claim.
	Cohort string
	// Cost is the claim's worst case.
	Cost quota.Charge
	// OverruledBy names what admitted a claim the quota would have denied
	// (a Kueue workload); empty otherwise.
	OverruledBy string
}

// Admit decides on a claim being created. An admitted claim that costs
// anything is reserved in its tenant's book of the ledger before the answer
// (unless dryRun), so that every replica counts it until its cache shows
// the claim. Admissions on one book are committed in groups: whoever finds
// the book free decides every claim waiting for it, in order, and writes
// their reservations at once; the book's resourceVersion checks the write
// across processes, and a replica that lost the race decides the group
// again on what the winner wrote.
func (a *Accountant) Admit(ctx context.Context, claim *resourceapi.ResourceClaim, dryRun bool) (Admission, error) {
	return a.admit(ctx, claim, dryRun, nil)
}

// admitOverruled admits a claim the quota denied because something else
// with the authority to admit it did (e.g. Kueue, for the workload that owns
// its pod): the tenant's gpuUnits and gpuMemory limits are lifted for it,
// and the device limits of the classes in ov, never those of other
// profiles. A claim of no tenant, or of an invalid one, is never
// overruled. The claim is reserved like any other, so the claims that
// follow are judged against what it holds.
func (a *Accountant) admitOverruled(ctx context.Context, claim *resourceapi.ResourceClaim, dryRun bool, ov overruling) (Admission, error) {
	return a.admit(ctx, claim, dryRun, &ov)
}

func (a *Accountant) admit(ctx context.Context, claim *resourceapi.ResourceClaim, dryRun bool, ov *overruling) (Admission, error) {
	if err := a.prefetchNamespace(ctx, claim.Namespace); err != nil {
		return Admission{}, err
	}
	tenant, ok, err := a.tenantOf(ctx, claim.Namespace)
	if err != nil {
		return Admission{}, err
	}
	if !ok { // no quota, or an invalid one, applies: nothing to reserve or overrule
		return a.decide(ctx, claim, nil, nil, nil)
	}
	b := a.ledger.bookFor(tenant)
	if dryRun { // nothing is written: the last read of the book will do
		return a.decideOverruled(ctx, claim, b.snapshot().entries, ov, nil)
	}
	// Priced under this caller's deadline, before it joins the group: the
	// group's other callers must not wait for its selectors (issue 36).
	pc, err := a.price(ctx, claim)
	if err != nil {
		return Admission{}, err
	}
	req := &pendingAdmission{claim: claim, overrule: ov, priced: pc, done: make(chan admitResult, 1)}
	b.enqueue(req)
	select {
	case r := <-req.done: // decided in another caller's group
		return r.adm, r.err
	case b.turn <- struct{}{}:
	case <-ctx.Done():
		// The API server has given up on this request: leave the queue so
		// that nothing is reserved for it. A group that took it already
		// may reserve it; unused, the reservation lapses after
		// reservationGrace like that of any create that did not persist.
		b.withdraw(req)
		return Admission{}, fmt.Errorf("waiting for the quota book of %s: %w", b.owner, context.Cause(ctx))
	}
	defer func() { <-b.turn }()
	select {
	case r := <-req.done:
		return r.adm, r.err
	default:
	}
	// The group's callers wait on this one: its write must not fail
	// because this caller's request was cancelled.
	gctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), groupTimeout)
	defer cancel()
	a.commitGroup(gctx, b, b.takeQueue())
	r := <-req.done
	return r.adm, r.err
}

// commitGroup decides the waiting admissions in order, each counting the
// reservations of those before it, writes the new reservations in one
// update of the book and answers every caller.
func (a *Accountant) commitGroup(ctx context.Context, b *book, group []*pendingAdmission) {
	if !b.loaded {
		if err := b.load(ctx, a.ledger.client); err != nil {
			ledgerErrors.Inc()
			answerAll(group, err)
			return
		}
	}
	for attempt := 1; ; attempt++ {
		held := b.snapshot()
		if err := a.progress.await(ctx, held.settled, catchUpWait); err != nil {
			answerAll(group, err)
			return
		}
		results, next, reserved, plans := a.decideGroup(ctx, held, group)
		if !reserved {
			answer(group, results)
			return
		}
		err := b.write(ctx, a.ledger.client, next)
		if err == nil {
			a.reclaim(ctx, plans) // only once the reclaim entries are in the book
			answer(group, results)
			return
		}
		if !conflicted(err) || attempt == ledgerAttempts {
			ledgerErrors.Inc()
			answerAll(group, err)
			return
		}
		klog.FromContext(ctx).V(4).Info("Quota ledger changed by another replica, deciding again", "book", b.key, "claims", len(group))
		if err := b.load(ctx, a.ledger.client); err != nil {
			ledgerErrors.Inc()
			answerAll(group, err)
			return
		}
	}
}

// decideGroup decides each admission against the book plus the group's
// earlier reservations; reserved tells whether the book changed, plans
// what to reclaim for lenders refused (reclaim.go) once it is written.
func (a *Accountant) decideGroup(ctx context.Context, held bookState, group []*pendingAdmission) ([]admitResult, bookState, bool, []*reclaimPlan) {
	results := make([]admitResult, len(group))
	reserved := false
	var plans []*reclaimPlan
	for i, req := range group {
		adm, err := a.decideOverruled(ctx, req.claim, held.entries, req.overrule, req.priced)
		switch {
		case err != nil:
		case adm.Allowed && !adm.Cost.IsZero():
			next, full := a.reserve(held, req.claim, adm.Cost, adm.Tenant)
			if full != "" {
				adm.Decision = quota.Decision{Resource: resourceLedger, Reason: full}
			} else {
				held, reserved = next, true
			}
		case !adm.Allowed:
			plan, why := a.planReclaim(ctx, held, req.claim, adm)
			adm.Reason += why
			if plan != nil {
				held.entries = append(slices.Clip(held.entries), plan.entry)
				reserved, plans = true, append(plans, plan)
			}
		}
		results[i] = admitResult{adm: adm, err: err}
	}
	return results, held, reserved, plans
}

// resourceTenant is the Decision.Resource of a claim refused for its
// namespace's tenancy (no TenantQuota with DenyUnassigned, or an invalid
// one) rather than for a limit: nothing overrules those.
const resourceTenant = "tenant"

// resourceLedger is the Decision.Resource of a claim refused because its
// tenant's reservations, or its book, are at their cap (see maxBookBytes).
const resourceLedger = "reservations"

// resourceBudget is the Decision.Resource of a claim refused because its
// tenant's budget is exhausted and its action is RefuseNewClaims.
const resourceBudget = "budget"

// overrulable: a refusal for a limit, which whoever may admit past the
// quota (Kueue) can overrule; not one for the tenancy, nor one for a claim
// that cannot be priced, whose cost nobody could cap, nor one for a
// shape's instances (Kueue charges devices, not shapes), nor one for the
// budget (Kueue knows no money).
func overrulable(resource string) bool {
	return resource != resourceTenant && resource != quota.ResourceUnpriced && resource != resourceLedger &&
		resource != resourceBudget && !quota.IsShapeResource(resource)
}

// overruling is what lets a claim past its tenant's limits: who decided
// (for the warning and the metrics) and which device limits it lifts.
type overruling struct {
	by string
	// classes are the DeviceClasses whose device limits are lifted: those
	// that whoever overrules charged. The limits of other profiles the
	// claim's devices belong to still hold.
	classes sets.Set[string]
	// charged is what Kueue charged the tenant's active workloads, in GPU
	// units, and capped the units the tenant may hold with it, Kueue's
	// rounding allowed for (KueueGate.tenantCharge); nil when the overruler
	// charges nothing.
	charged, capped *quota.Units
}

// lift is the tenant as the overruled claim is judged. Usage that Kueue
// sees and usage that it does not add up against one TenantQuota (issue
// 36): the tenant's GPU units, its claims outside Kueue's workloads
// included, stay within the larger of its limit (with the borrowing the
// cohort permits) and what Kueue charged its active workloads. Kueue's
// charge already holds whatever it borrowed in its cohort, so a limit
// raised to it borrows nothing more. The gpuMemory limit is lifted, as
// Kueue charges no memory (the units still bound the GPUs held), and so
// are the device limits of the classes Kueue charged.
func (o *overruling) lift(t quota.Tenant) quota.Tenant {
	t.Limits.Memory, t.Borrow.Memory = nil, nil
	if l := t.Limits.Units; l != nil && o.capped != nil && o.capped.Cmp(*l) > 0 {
		t.Limits.Units, t.Borrow.Units, t.Cohort = o.capped, ptr.To(quota.Units{}), ""
	}
	devices := make(map[string]int64, len(t.Limits.Devices))
	for class, n := range t.Limits.Devices {
		if !o.classes.Has(class) {
			devices[class] = n
		}
	}
	t.Limits.Devices = devices
	return t
}

// refusal is what the overruled claim's refusal adds to say why the
// overrule did not let it through.
func (o *overruling) refusal(lifted Admission, tenant string) string {
	if lifted.Resource == quota.ResourceGpuUnits && o.charged != nil {
		return fmt.Sprintf("; %s, but Kueue charged the active workloads of TenantQuota %q %s GPU units (%s with its rounding), "+
			"and its claims outside them (bare pods, claims of ended workloads) count against that too", o.by, tenant, o.charged, o.capped)
	}
	if quota.IsShapeResource(lifted.Resource) {
		return fmt.Sprintf("; %s, which does not lift the limits on shapes' instances", o.by)
	}
	return fmt.Sprintf("; %s, which does not lift the limits of other profiles", o.by)
}

// decideOverruled decides a claim, and one the quota denies again with the
// limits ov lifts, if any.
func (a *Accountant) decideOverruled(ctx context.Context, claim *resourceapi.ResourceClaim, held []reservation, ov *overruling, pc *priced) (Admission, error) {
	adm, err := a.decide(ctx, claim, held, nil, pc)
	if err != nil || adm.Allowed || ov == nil || !overrulable(adm.Resource) {
		return adm, err
	}
	lifted, err := a.decide(ctx, claim, held, ov.lift, pc)
	if err != nil {
		return adm, err
	}
	if !lifted.Allowed {
		lifted.Reason += ov.refusal(lifted, lifted.Tenant)
		return lifted, nil
	}
	// The warning on the admitted claim tells what it is over.
	adm.Allowed, adm.Borrows, adm.OverruledBy = true, false, ov.by
	return adm, nil
}

// tenantOf is the valid tenant a namespace is charged to; ok is false when
// no quota, or an invalid one, applies (nothing to reserve then).
func (a *Accountant) tenantOf(ctx context.Context, namespace string) (quota.Tenant, bool, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	ten, err := a.tenancyLocked(ctx)
	if err != nil {
		return quota.Tenant{}, false, err
	}
	owner, err := a.ownerLocked(ctx, ten, namespace)
	if err != nil || owner == "" || ten.invalid[owner] != "" {
		return quota.Tenant{}, false, err
	}
	return ten.tenants[owner], true, nil
}

// decide prices and judges a claim against the cache plus the book's
// reservations.
// lift, when set, changes the limits the claim is judged against; pc, when
// priced by the same pricer, is the claim's price.
func (a *Accountant) decide(ctx context.Context, claim *resourceapi.ResourceClaim, held []reservation, lift func(quota.Tenant) quota.Tenant, pc *priced) (Admission, error) {
	cat, ten, err := a.snapshots(ctx)
	if err != nil {
		return Admission{}, err
	}
	owner, err := a.ownerLocked(ctx, ten, claim.Namespace)
	if err != nil {
		return Admission{}, err
	}
	if pc == nil || pc.pricer != cat.pricer { // the catalog changed since: priced again
		pc = priceWith(ctx, cat.pricer, claim)
	}
	adm := Admission{Tenant: owner, Cost: pc.cost, Decision: quota.Decision{Allowed: true}}
	switch {
	case adm.Cost.IsZero():
		return adm, nil
	case owner == "":
		if a.DenyUnassigned {
			adm.Allowed, adm.Resource = false, resourceTenant
			adm.Reason = fmt.Sprintf("namespace %s belongs to no TenantQuota, and GPUs are only for tenants", claim.Namespace)
		}
		return adm, nil
	case ten.invalid[owner] != "":
		adm.Allowed, adm.Resource = false, resourceTenant
		adm.Reason = fmt.Sprintf("TenantQuota %q is invalid and refuses every claim until it is fixed: %s", owner, ten.invalid[owner])
		return adm, nil
	}
	if msg := ten.budgetRefusal(owner, a.now()); msg != "" {
		adm.Allowed, adm.Resource, adm.Reason = false, resourceBudget, msg
		return adm, nil
	}
	tenant := ten.tenants[owner]
	// Before any lift: a claim whose worst case nothing bounds yet cannot
	// be held to what Kueue charged either.
	if d := quota.DecideUnpriced(tenant, pc.unpriced); !d.Allowed {
		adm.Decision = d
		return adm, nil
	}
	if lift != nil {
		tenant = lift(tenant)
	}
	adm.Cohort = tenant.Cohort
	usage, peers, err := a.usageOf(ctx, cat, ten, owner, held)
	if err != nil {
		return adm, err
	}
	adm.Decision = quota.DecideIdle(tenant, usage, adm.Cost, peers)
	if !adm.Allowed {
		adm.Reason += guessNote(pc.guessed)
	}
	return adm, nil
}

// guessNote tells a refused tenant which of its classes were priced as a
// whole GPU for want of a published device (none yet, or none this cluster
// can publish: a GpuNode's status.missingFeatures says which).
func guessNote(classes []string) string {
	if len(classes) == 0 {
		return ""
	}
	return fmt.Sprintf(" (no published device matches class %q, so each of its devices is priced as a whole GPU:"+
		" see the nodes' GpuNode status for what this cluster does not offer)", strings.Join(classes, `", "`))
}

// TenantReport is what the quota reconciler writes to a TenantQuota's
// status.
type TenantReport struct {
	Tenant     quota.Tenant
	Namespaces []string
	Conflicts  []string
	Invalid    string
	Usage      quota.Usage
}

// Report computes a tenant's status from the cache and what this replica
// last read of its book.
func (a *Accountant) Report(ctx context.Context, name string) (TenantReport, error) {
	held := a.heldFor(ctx, name)
	cat, ten, err := a.snapshots(ctx)
	if err != nil {
		return TenantReport{}, err
	}
	r := TenantReport{
		Tenant:     ten.tenants[name],
		Namespaces: ten.assign.Namespaces[name],
		Conflicts:  ten.assign.Conflicts[name],
		Invalid:    ten.invalid[name],
	}
	r.Usage, _, err = a.usageOf(ctx, cat, ten, name, held)
	return r, err
}

// ProfileDevices counts the published devices a class selects and how many
// of them some claim holds.
func (a *Accountant) ProfileDevices(ctx context.Context, exprs []string) (catalog.ProfileReport, error) {
	a.mu.Lock()
	cat, err := a.catalogLocked(ctx)
	a.mu.Unlock()
	if err != nil {
		return catalog.ProfileReport{}, err
	}
	var claims resourceapi.ResourceClaimList
	if err := a.reader.List(ctx, &claims, client.UnsafeDisableDeepCopy); err != nil {
		return catalog.ProfileReport{}, fmt.Errorf("listing ResourceClaims: %w", err)
	}
	allocated := allocatedDevices(claims.Items)
	givable, err := a.givableDevices(ctx, claims.Items)
	if err != nil {
		return catalog.ProfileReport{}, err
	}
	var r catalog.ProfileReport
	for _, d := range cat.pricer.Inventory().Devices() {
		if quota.Matches(ctx, d, exprs) {
			r.Matching++
			if allocated[d.ID] {
				r.Allocated++
			}
			if givable[d.ID] {
				r.Free++
			}
		}
	}
	return r, nil
}

// givableDevices are the devices of our driver a claim could be given now
// (posture.Givable), on every node.
func (a *Accountant) givableDevices(ctx context.Context, claims []resourceapi.ResourceClaim) (map[quota.DeviceID]bool, error) {
	var slices resourceapi.ResourceSliceList
	if err := a.reader.List(ctx, &slices, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("listing ResourceSlices: %w", err)
	}
	pools := map[string]bool{}
	for _, s := range slices.Items {
		if s.Spec.Driver == quota.DriverName {
			pools[s.Spec.Pool.Name] = true
		}
	}
	out := map[quota.DeviceID]bool{}
	for pool := range pools {
		for name, ok := range posture.Givable(pool, slices.Items, claims) {
			if ok {
				out[quota.DeviceID{Driver: quota.DriverName, Pool: pool, Device: name}] = true
			}
		}
	}
	return out, nil
}

// allocatedDevices are the devices of our driver that claims hold.
func allocatedDevices(claims []resourceapi.ResourceClaim) map[quota.DeviceID]bool {
	out := map[quota.DeviceID]bool{}
	for _, c := range claims {
		if c.Status.Allocation == nil {
			continue
		}
		for _, r := range c.Status.Allocation.Devices.Results {
			if r.Driver == quota.DriverName {
				out[quota.DeviceID{Driver: r.Driver, Pool: r.Pool, Device: r.Device}] = true
			}
		}
	}
	return out
}

// PublishedMigProfiles are the MIG profile names nodes publish.
func (a *Accountant) PublishedMigProfiles(ctx context.Context) (map[string]bool, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	cat, err := a.catalogLocked(ctx)
	if err != nil {
		return nil, err
	}
	return cat.migs, nil
}

// NamespaceOwner is the quota a namespace is charged to ("" if none).
func (a *Accountant) NamespaceOwner(ctx context.Context, namespace string) (string, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	ten, err := a.tenancyLocked(ctx)
	if err != nil {
		return "", err
	}
	return a.ownerLocked(ctx, ten, namespace)
}

// Holdings is what billing records of a claim: the quota its namespace is
// charged to ("" if none) and each device of ours it holds, priced.
func (a *Accountant) Holdings(ctx context.Context, claim *resourceapi.ResourceClaim) (string, []quota.Held, error) {
	cat, _, err := a.snapshots(ctx)
	if err != nil {
		return "", nil, err
	}
	tenant, err := a.NamespaceOwner(ctx, claim.Namespace)
	if err != nil {
		return "", nil, err
	}
	return tenant, cat.pricer.HeldDevices(ctx, claim), nil
}

// HeldByOthers lists which of a TenantQuota's namespaces another quota
// already holds, for the warning when the quota is created or changed.
func (a *Accountant) HeldByOthers(ctx context.Context, name string, namespaces []string) ([]string, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	ten, err := a.tenancyLocked(ctx)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, ns := range namespaces {
		if q, ok := ten.owner[ns]; ok && q != name {
			out = append(out, fmt.Sprintf("namespace %s is already charged to TenantQuota %q", ns, q))
		}
	}
	return out, nil
}

// priced is a claim's price as one pricer worked it out: its worst-case
// cost and the requests nothing published bounds yet.
type priced struct {
	pricer   *quota.Pricer
	cost     quota.Charge
	unpriced []quota.Unpriced
	// guessed: classes priced at the fallback of a whole GPU (Guessed).
	guessed []string
}

// price prices a claim with the caller's context against the current
// catalog. Pricing evaluates the claim's CEL selectors against every
// published device; a caller whose deadline ends first gets its requests
// marked interrupted, which refuses the claim as unpriced.
func (a *Accountant) price(ctx context.Context, claim *resourceapi.ResourceClaim) (*priced, error) {
	cat, _, err := a.snapshots(ctx)
	if err != nil {
		return nil, err
	}
	return priceWith(ctx, cat.pricer, claim), nil
}

// priceWith prices a claim within its CEL budget (quota.MaxCELCostPerClaim).
func priceWith(ctx context.Context, p *quota.Pricer, claim *resourceapi.ResourceClaim) *priced {
	ctx, stop := quota.WithCELBudget(ctx, quota.MaxCELCostPerClaim)
	defer stop()
	return &priced{pricer: p, cost: p.ClaimCost(ctx, &claim.Spec), unpriced: p.Unpriced(ctx, &claim.Spec),
		guessed: p.Guessed(ctx, &claim.Spec)}
}

// Candidates are the published devices a request of class, with selectors
// sel and capacity capReq, can be allocated, and what each allocation
// consumes (quota.Pricer.Candidates), in the current catalog.
func (a *Accountant) Candidates(ctx context.Context, class string, sel []resourceapi.DeviceSelector, capReq *resourceapi.CapacityRequirements) ([]quota.Candidate, error) {
	a.mu.Lock()
	cat, err := a.catalogLocked(ctx)
	a.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return cat.pricer.Candidates(ctx, class, sel, capReq), nil
}
