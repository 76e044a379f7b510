package admission

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpuaas/gpu-dra-driver/pkg/quota"
)

// Lenders reclaim (issue 26 item 6). A cohort never holds more than the sum
// of its members' limits, so a tenant whose own quota is out on loan is
// refused even within its own limit. A borrower could keep that loan with
// claims no pod ever uses: an unallocated claim is charged its worst case
// for as long as it exists. The rule: quota a borrower holds with claims
// that have stayed unallocated for longer than Accountant.ReclaimAfter is
// given back to a lender that asks for it. When a lender's claim is refused
// only because its quota is lent out, the deciding replica
//
//  1. picks such claims of the borrowers, newest first, taking from a
//     borrower no more than it borrows, until they cover what the lender
//     lacks (if they cannot, nothing is reclaimed and the lender waits).
//     Only claims the kube-controller-manager made from a pod's template
//     are taken (templatePods.madeFromTemplate), as it makes them again;
//     a standalone claim, deleted, is gone for good, so it is taken only
//     from a borrower whose TenantQuota opts in (reclaimStandaloneClaims);
//  2. writes, in the same update of the cohort's book as every admission,
//     a reclaim entry: the lender's claim's cost, kept for the lender's
//     tenant. Every replica counts it as that tenant's for every other
//     tenant's decision, and not for the tenant's own, so a borrower's
//     claim re-created a moment later (the kube-controller-manager makes a
//     pod's claim again) cannot take the freed quota first. It lapses like
//     any reservation (reservationGrace);
//  3. deletes the picked claims, each only if it is still unallocated (the
//     delete is preconditioned on the resourceVersion last read: a claim
//     the scheduler allocated meanwhile is kept; any other write to it, a
//     label, is read again and the delete retried). An unallocated claim
//     being deleted is charged nothing, so a finalizer the borrower added
//     keeps the object, not the quota.
//
// The lender's refusal says so; its pod is nudged, and its claim admitted,
// once the deletions reach the cache. Allocated claims are never taken: a
// running pod keeps what it has.

// reclaimVictim is a borrower's claim picked to give quota back.
type reclaimVictim struct {
	key             types.NamespacedName
	uid             types.UID
	resourceVersion string
	tenant          string
	charge          quota.Charge
	created         time.Time
	// fromTemplate: the kube-controller-manager made the claim from a
	// pod's template, and makes it again; else the borrower's TenantQuota
	// opted its standalone claims in (reclaimStandaloneClaims).
	fromTemplate bool
}

// reclaimPlan is what one lender's refusal reclaims.
type reclaimPlan struct {
	lender  string
	entry   reservation
	victims []reclaimVictim
}

// reclaimID is the UID of a reclaim entry for a lender's claim; no claim
// has it, so no cache ever shows it settled.
func reclaimID(claim *resourceapi.ResourceClaim) types.UID {
	return "reclaim-" + claim.UID
}

// planReclaim decides what to reclaim for a claim refused with adm; nil
// when nothing is (reclaiming is off, the refusal is not a loan's, a
// reclaim for the tenant is already under way, or not enough is
// reclaimable). The reason is what the lender is told either way.
func (a *Accountant) planReclaim(ctx context.Context, held bookState, claim *resourceapi.ResourceClaim, adm Admission) (*reclaimPlan, string) {
	if a.ReclaimAfter <= 0 || adm.Allowed || (adm.Lent.Units.Sign() <= 0 && adm.Lent.Memory <= 0) {
		return nil, ""
	}
	owner := a.owners()
	now := a.now()
	for _, r := range held.entries {
		if r.Reclaim && owner[r.Namespace] == adm.Tenant && !r.lapsed(now) {
			return nil, " Quota is being reclaimed for it from the cohort's unallocated claims: retried when they are gone."
		}
	}
	cat, ten, err := a.snapshots(ctx)
	if err != nil {
		klog.FromContext(ctx).Error(err, "Not reclaiming lent quota", "tenant", adm.Tenant)
		return nil, ""
	}
	candidates, err := a.reclaimCandidates(ctx, cat, ten, adm.Tenant)
	if err != nil {
		klog.FromContext(ctx).Error(err, "Not reclaiming lent quota", "tenant", adm.Tenant)
		return nil, ""
	}
	victims, ok := pickVictims(candidates, adm.Lent)
	if !ok {
		return nil, fmt.Sprintf(" Its peers' claims unallocated for over %s do not cover it: it waits.", a.ReclaimAfter)
	}
	entry := newReservation(types.NamespacedName{Namespace: claim.Namespace}, reclaimID(claim),
		quota.Charge{Units: adm.Cost.Units, Memory: adm.Cost.Memory}, now)
	entry.Reclaim = true
	names := make([]string, len(victims))
	for i, v := range victims {
		names[i] = v.key.String()
	}
	return &reclaimPlan{lender: adm.Tenant, entry: entry, victims: victims},
		fmt.Sprintf(" Reclaiming it: deleting %d of the borrowers' claims unallocated for over %s (%s); retried when they are gone.",
			len(victims), a.ReclaimAfter, strings.Join(names, ", "))
}

// borrower is a cohort peer over its own limits, with the claims it could
// give back.
type borrower struct {
	tenant   quota.Tenant
	borrowed dimVals // beyond its own limits, per resource
	claims   []reclaimVictim
}

// reclaimCandidates are lender's cohort peers that borrow, with their
// claims unallocated for longer than ReclaimAfter, as the cache shows them.
func (a *Accountant) reclaimCandidates(ctx context.Context, cat *priceList, ten *tenancy, lender string) ([]*borrower, error) {
	cohort := ten.tenants[lender].Cohort
	cutoff := a.now().Add(-a.ReclaimAfter)
	var out []*borrower
	pods := &templatePods{live: a.apiReader, pods: map[types.NamespacedName]*corev1.Pod{}}
	for _, name := range slices.Sorted(maps.Keys(ten.tenants)) {
		t := ten.tenants[name]
		if name == lender || t.Cohort != cohort || ten.invalid[name] != "" {
			continue
		}
		b := &borrower{tenant: t}
		var total quota.Charge
		for _, ns := range ten.assign.Namespaces[name] {
			var claims resourceapi.ResourceClaimList
			if err := a.reader.List(ctx, &claims, client.InNamespace(ns)); err != nil {
				return nil, fmt.Errorf("listing ResourceClaims of namespace %s: %w", ns, err)
			}
			for i := range claims.Items {
				c := &claims.Items[i]
				charged := a.charge(ctx, cat, c)
				total = total.Add(charged.Charge)
				if charged.Allocated || c.DeletionTimestamp != nil || !c.CreationTimestamp.Time.Before(cutoff) || charged.Charge.IsZero() {
					continue
				}
				fromTemplate, err := pods.madeFromTemplate(ctx, c)
				if err != nil {
					return nil, err
				}
				if !fromTemplate && !t.ReclaimStandalone {
					continue // deleted, nothing would make it again
				}
				b.claims = append(b.claims, reclaimVictim{key: types.NamespacedName{Namespace: c.Namespace, Name: c.Name},
					uid: c.UID, resourceVersion: c.ResourceVersion, tenant: name, charge: charged.Charge, created: c.CreationTimestamp.Time,
					fromTemplate: fromTemplate})
			}
		}
		b.borrowed = beyondLimits(t.Limits, total)
		if len(b.claims) > 0 && (b.borrowed[0].Sign() > 0 || b.borrowed[1].Sign() > 0) {
			out = append(out, b)
		}
	}
	return out, nil
}

// maxTemplatePodReads bounds the live pod reads of one reclaim plan: the
// pods are named by the claims' ownerReferences, which their authors
// write, and the plan is made inside the book's group commit. A claim whose
// pod is past the bound counts as standalone.
const maxTemplatePodReads = 32

// templatePods tells the claims the kube-controller-manager made from a
// pod's template, reading each pod named once, live (the cache holds no
// pods).
type templatePods struct {
	live  client.Reader
	pods  map[types.NamespacedName]*corev1.Pod // nil: not found
	reads int
}

// madeFromTemplate reports whether the kube-controller-manager made claim
// for a pod's template claim, by what the API server vouches for and not
// by what the claim's author may write: the annotation
// resource.kubernetes.io/pod-claim-name and a controller ownerReference to
// a Pod are the claim's metadata, which whoever creates or edits the claim
// writes, so they only say which pod to ask; the pod, found with the UID
// named, must be running or waiting (not being deleted) and its
// status.resourceClaimStatuses, which only the kube-controller-manager
// writes (pods/status; no tenant role grants it), must name this claim for
// that template claim. Such a claim, deleted, is made again for the pod.
func (p *templatePods) madeFromTemplate(ctx context.Context, claim *resourceapi.ResourceClaim) (bool, error) {
	podClaim := claim.Annotations[resourceapi.PodResourceClaimAnnotation]
	ref := metav1.GetControllerOf(claim)
	if podClaim == "" || ref == nil || ref.APIVersion != "v1" || ref.Kind != "Pod" {
		return false, nil
	}
	key := types.NamespacedName{Namespace: claim.Namespace, Name: ref.Name}
	pod, seen := p.pods[key]
	if !seen {
		if p.reads >= maxTemplatePodReads {
			return false, nil
		}
		p.reads++
		pod = &corev1.Pod{}
		if err := p.live.Get(ctx, key, pod); err != nil {
			if !apierrors.IsNotFound(err) {
				return false, fmt.Errorf("reading pod %s, the controller of claim %s: %w", key, claim.Name, err)
			}
			pod = nil
		}
		p.pods[key] = pod
	}
	if pod == nil || pod.UID != ref.UID || pod.DeletionTimestamp != nil {
		return false, nil
	}
	for _, st := range pod.Status.ResourceClaimStatuses {
		if st.Name == podClaim && ptr.Deref(st.ResourceClaimName, "") == claim.Name {
			return true, nil
		}
	}
	return false, nil
}

// beyondLimits is how far total goes past limits on each borrowable
// resource (zero where it does not, or where there is no limit: a member
// without one neither lends nor borrows it).
func beyondLimits(l quota.Limits, total quota.Charge) dimVals {
	var out dimVals
	if l.Units != nil {
		out[0] = quota.MaxUnits(total.Units.Sub(*l.Units), quota.Units{})
	}
	if l.Memory != nil {
		out[1] = quota.MaxUnits(quota.WholeUnits(total.Memory-*l.Memory), quota.Units{})
	}
	return out
}

// pickVictims takes the newest claims first (those that have waited
// least; creation time, then resourceVersion), from a borrower only while it still borrows a resource the lender
// lacks, until they cover need; ok is false when they cannot.
func pickVictims(borrowers []*borrower, need quota.Charge) ([]reclaimVictim, bool) {
	type candidate struct {
		b *borrower
		v reclaimVictim
	}
	var all []candidate
	for _, b := range borrowers {
		for _, v := range b.claims {
			all = append(all, candidate{b: b, v: v})
		}
	}
	slices.SortStableFunc(all, func(x, y candidate) int {
		if c := y.v.created.Compare(x.v.created); c != 0 {
			return c
		}
		// Creation times have seconds only; of two unchanged claims the
		// later resourceVersion is the later create.
		switch {
		case newer(x.v.resourceVersion, y.v.resourceVersion):
			return -1
		case newer(y.v.resourceVersion, x.v.resourceVersion):
			return 1
		}
		return 0
	})
	want := dimsOf(need)
	var got dimVals
	var victims []reclaimVictim
	for _, c := range all {
		if enough(got, want) {
			break
		}
		d := dimsOf(c.v.charge)
		if !helps(d, c.b.borrowed, got, want) {
			continue
		}
		victims = append(victims, c.v)
		got = got.plus(d, bothDims)
		c.b.borrowed = c.b.borrowed.minus(d, bothDims)
	}
	return victims, enough(got, want)
}

func enough(got, want dimVals) bool {
	return got[0].Cmp(want[0]) >= 0 && got[1].Cmp(want[1]) >= 0
}

// helps: the claim gives back, on some resource still short, quota its
// borrower borrows.
func helps(d, borrowed, got, want dimVals) bool {
	for i := range d {
		if d[i].Sign() > 0 && borrowed[i].Sign() > 0 && got[i].Cmp(want[i]) < 0 {
			return true
		}
	}
	return false
}

// reclaim deletes the plans' claims, after their reclaim entries were
// written; in the background, as the lender's answer does not wait for it.
func (a *Accountant) reclaim(ctx context.Context, plans []*reclaimPlan) {
	if len(plans) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), groupTimeout)
	go func() {
		defer cancel()
		for _, p := range plans {
			for _, v := range p.victims {
				a.deleteVictim(ctx, p.lender, v)
			}
		}
	}()
}

// reclaimDeleteTries bounds the deletes of one victim: a conflict is
// re-read and retried while the claim is still unallocated with the same
// UID, so a borrower that relabels its idle claims in a loop has to win
// that race every time.
const reclaimDeleteTries = 5

// deleteVictim deletes one claim while it is still what it was judged: the
// same UID, unallocated. The delete is preconditioned on the
// resourceVersion last read, so a claim the scheduler allocates between the
// read and the delete is kept; a conflict (any write to the claim, a label
// as well as an allocation) reads the claim again and decides anew.
func (a *Accountant) deleteVictim(ctx context.Context, lender string, v reclaimVictim) {
	logger := klog.FromContext(ctx).WithValues("lender", lender, "borrower", v.tenant, "resourceClaim", v.key)
	rv := v.resourceVersion
	for try := 1; ; try++ {
		c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: v.key.Namespace, Name: v.key.Name, UID: v.uid}}
		err := a.ledger.client.Delete(ctx, c, client.Preconditions{UID: &v.uid, ResourceVersion: &rv})
		switch {
		case err == nil:
			a.confirmReclaim(ctx, logger, lender, v)
			return
		case apierrors.IsNotFound(err):
			logger.V(2).Info("Not reclaiming a claim deleted meanwhile")
			return
		case apierrors.IsConflict(err) && try < reclaimDeleteTries:
			fresh, why, err := a.rereadVictim(ctx, v)
			if err != nil {
				logger.Error(err, "Reclaiming lent quota: reading a borrower's claim again after a conflict")
				return
			}
			if why != "" {
				logger.V(2).Info("Not reclaiming a claim that changed", "why", why)
				return
			}
			rv = fresh.ResourceVersion
		default:
			logger.Error(err, "Reclaiming lent quota: deleting a borrower's claim", "tries", try)
			return
		}
	}
}

// rereadVictim reads a victim live after a conflicting delete; why says,
// when it is not empty, why the claim is no longer one to delete.
func (a *Accountant) rereadVictim(ctx context.Context, v reclaimVictim) (*resourceapi.ResourceClaim, string, error) {
	var fresh resourceapi.ResourceClaim
	err := a.ledger.client.Get(ctx, v.key, &fresh)
	switch {
	case apierrors.IsNotFound(err):
		return nil, "deleted meanwhile", nil
	case err != nil:
		return nil, "", fmt.Errorf("getting ResourceClaim %s: %w", v.key, err)
	case fresh.UID != v.uid:
		return nil, "another claim of the name", nil
	case fresh.Status.Allocation != nil:
		return nil, "allocated meanwhile", nil
	case fresh.DeletionTimestamp != nil:
		return nil, "being deleted already (it costs nothing)", nil
	}
	return &fresh, "", nil
}

// confirmReclaim reads a deleted victim back: the metric counts it, and the
// borrower is told it is gone, only when it is; one that finalizers keep
// is charged nothing while it waits (quota.Pricer.Cost), and the borrower
// is told that instead.
func (a *Accountant) confirmReclaim(ctx context.Context, logger klog.Logger, lender string, v reclaimVictim) {
	c := &resourceapi.ResourceClaim{}
	err := a.ledger.client.Get(ctx, v.key, c)
	switch {
	case apierrors.IsNotFound(err) || (err == nil && c.UID != v.uid):
		c.ObjectMeta = metav1.ObjectMeta{Namespace: v.key.Namespace, Name: v.key.Name, UID: v.uid}
		reclaimedClaims.WithLabelValues(v.tenant).Inc()
		a.recordReclaim(c, lender, v)
		logger.Info("Reclaimed lent quota: deleted a borrower's unallocated claim", "units", v.charge.Units.String(), "memory", v.charge.Memory)
	case err != nil:
		logger.Error(err, "Reclaimed lent quota: reading a deleted claim back")
	default:
		a.recordEvent(c, "QuotaReclaimed", fmt.Sprintf(
			"marked for deletion: the claim borrowed its cohort's quota and stayed unallocated for over %s, and TenantQuota %q needs its own quota back; "+
				"finalizers %s keep it, but it is charged nothing and is never allocated",
			a.ReclaimAfter, lender, strings.Join(c.Finalizers, ", ")))
		logger.Info("Reclaimed lent quota: a borrower's unallocated claim is being deleted, held by finalizers", "finalizers", c.Finalizers)
	}
}

// recordEvent tells the tenant, on the claim (and so in its namespace's
// events), why the controller deleted it.
func (a *Accountant) recordEvent(c *resourceapi.ResourceClaim, reason, note string) {
	if a.ReclaimEvents != nil {
		a.ReclaimEvents.Eventf(c, nil, corev1.EventTypeWarning, reason, "DeleteResourceClaim", "%s", note)
	}
}

// recordReclaim tells the borrower, on the claim (and so in its
// namespace's events), why the claim goes, and whether anything makes it
// again.
func (a *Accountant) recordReclaim(c *resourceapi.ResourceClaim, lender string, v reclaimVictim) {
	again := "the kube-controller-manager makes the pod's claim again, and it waits for quota"
	if !v.fromTemplate {
		again = fmt.Sprintf("no pod's template made it, so nothing makes it again (TenantQuota %q has reclaimStandaloneClaims set)", v.tenant)
	}
	a.recordEvent(c, "QuotaReclaimed", fmt.Sprintf(
		"deleted: the claim borrowed its cohort's quota and stayed unallocated for over %s, and TenantQuota %q needs its own quota back; %s",
		a.ReclaimAfter, lender, again))
}
