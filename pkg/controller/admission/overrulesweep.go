package admission

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
)

// An overruled claim ends with its workload (issue 36 route 2). The Kueue
// gate admits a claim past its tenant's quota only for a workload Kueue
// admitted; the kube-controller-manager deletes the claim when its pod is
// done. A tenant that removes the claim's ownerReference (or deletes the
// pod with --cascade=orphan) keeps the claim after that, and could use it
// from a pod of its own, outside Kueue, for as long as it likes. So the
// leader deletes every claim of the overrule books whose workload is no
// longer active (finished, evicted, gone) and whose own pod no longer runs:
// the pod the gate verified when it admitted the claim, recorded by UID in
// the book, not whatever the claim's ownerReference names now.
// A pod of the tenant that holds such a claim already keeps it until it
// ends (a running pod keeps what it has); no new pod can be given a claim
// that is being deleted. Until it is gone the claim is charged to its
// tenant like any other, so nothing else is admitted on top of it.

// overruleSweepPeriod is how often the leader looks for overruled claims
// that outlived their workloads.
var overruleSweepPeriod = 30 * time.Second

// overruleSweeper deletes the overruled claims whose workload ended.
type overruleSweeper struct {
	gate *KueueGate
}

// Sweeper is the leader's sweep of the claims overruled for workloads that
// have ended.
func (g *KueueGate) Sweeper() manager.Runnable {
	s := &overruleSweeper{gate: g}
	return &leaderSweep{name: "overrule-sweeper", failure: "Sweeping claims overruled for ended Kueue workloads failed",
		period: overruleSweepPeriod, sweep: s.sweep}
}

// sweep deletes, in every namespace with an overrule book, the claims whose
// workload ended.
func (s *overruleSweeper) sweep(ctx context.Context) error {
	var books corev1.ConfigMapList
	if err := s.gate.book.client.List(ctx, &books, client.InNamespace(s.gate.book.namespace),
		client.MatchingLabels{managedByLabel: managedBy}); err != nil {
		return fmt.Errorf("listing Kueue overrule books: %w", err)
	}
	for i := range books.Items {
		cm := &books.Items[i]
		namespace, ok := strings.CutPrefix(cm.Name, overruleBookPrefix)
		if !ok {
			continue
		}
		if err := s.sweepNamespace(ctx, namespace, overruleRecords(ctx, cm)); err != nil {
			return err
		}
	}
	return nil
}

func (s *overruleSweeper) sweepNamespace(ctx context.Context, namespace string, records []overruleRecord) error {
	if len(records) == 0 {
		return nil
	}
	workloads, err := s.gate.workloadsIn(ctx, namespace)
	if err != nil {
		return err
	}
	active := sets.New[types.UID]()
	for _, wl := range workloads {
		if wl.active {
			active.Insert(wl.uid)
		}
	}
	for _, r := range records {
		if active.Has(r.Workload) {
			continue
		}
		if err := s.endClaim(ctx, namespace, r); err != nil {
			return err
		}
	}
	return nil
}

// endClaim deletes the record's claim unless it is another claim of the
// same name, is being deleted already, or its pod still runs (the
// kube-controller-manager deletes it when the pod is done).
func (s *overruleSweeper) endClaim(ctx context.Context, namespace string, r overruleRecord) error {
	claim := &resourceapi.ResourceClaim{}
	err := s.gate.live.Get(ctx, types.NamespacedName{Namespace: namespace, Name: r.Name}, claim)
	switch {
	case apierrors.IsNotFound(err):
		return nil
	case err != nil:
		return fmt.Errorf("reading overruled claim %s/%s: %w", namespace, r.Name, err)
	case claim.UID != r.UID || claim.DeletionTimestamp != nil:
		return nil
	}
	running, err := s.podRuns(ctx, namespace, r)
	if err != nil || running {
		return err
	}
	logger := klog.FromContext(ctx).WithValues("resourceClaim", klog.KObj(claim), "workload", r.Workload)
	err = s.gate.book.client.Delete(ctx, claim, client.Preconditions{UID: &claim.UID, ResourceVersion: &claim.ResourceVersion})
	switch {
	case err == nil:
		overruledClaimsEnded.Inc()
		s.gate.acct.recordEvent(claim, "KueueWorkloadEnded", "deleted: the claim was admitted past its TenantQuota for a Kueue workload that has ended, and its pod is gone")
		logger.Info("Deleted a claim admitted past its quota for a Kueue workload that has ended")
	case apierrors.IsNotFound(err), apierrors.IsConflict(err): // changed meanwhile: looked at again next time
	default:
		return fmt.Errorf("deleting overruled claim %s/%s: %w", namespace, r.Name, err)
	}
	return nil
}

// podRuns tells whether the pod the gate verified the claim was made for
// (recorded by UID in the overrule book) exists and has not finished. The
// claim's current ownerReferences are not asked: the tenant edits them,
// and pointed at a never-ending pod of its own they kept the claim past
// its workload (issue 55 route 6). A record without a pod (written before
// pods were recorded) keeps nothing.
func (s *overruleSweeper) podRuns(ctx context.Context, namespace string, r overruleRecord) (bool, error) {
	if r.Pod == "" || r.PodName == "" {
		return false, nil
	}
	pod, err := newOwnerWalk(s.gate.live).pod(ctx, namespace, r.PodName)
	if err != nil || pod == nil || pod.UID != r.Pod {
		return false, err
	}
	return pod.Status.Phase != corev1.PodSucceeded && pod.Status.Phase != corev1.PodFailed, nil
}
