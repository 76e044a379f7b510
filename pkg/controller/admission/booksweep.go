package admission

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/quota"
)

// bookSweepPeriod is how often the leader deletes the books nobody uses.
const bookSweepPeriod = time.Minute

// bookSweeper deletes the quota books (gpuaas-quota-* ConfigMaps) of
// tenants and cohorts that no TenantQuota names any more, once their
// reservations have all lapsed: they were never deleted, so a cluster
// whose tenants come and go collected them for ever. The delete is
// conditional on the book's resourceVersion, so a book an admission wrote
// since it was read stays; and an admission that finds its book deleted
// creates it again (see conflicted).
type bookSweeper struct {
	client    client.Client // uncached, like the ledger's
	namespace string
	now       func() time.Time
}

// NewBookSweeper sweeps the books the ledger keeps in namespace of c, on
// the leader only.
func NewBookSweeper(c client.Client, namespace string) manager.Runnable {
	s := &bookSweeper{client: c, namespace: namespace, now: time.Now}
	return &leaderSweep{name: "book-sweeper", failure: "Sweeping unused quota books failed", period: bookSweepPeriod, sweep: s.sweep}
}

// sweep deletes each unused, lapsed book once.
func (s *bookSweeper) sweep(ctx context.Context) error {
	var quotas gpuaas.TenantQuotaList
	if err := s.client.List(ctx, &quotas); err != nil {
		return fmt.Errorf("listing TenantQuotas: %w", err)
	}
	inUse := sets.New[string]()
	for _, q := range quotas.Items {
		inUse.Insert(bookOwner(quota.Tenant{Name: q.Name, Cohort: q.Spec.Cohort}))
	}
	var books corev1.ConfigMapList
	if err := s.client.List(ctx, &books, client.InNamespace(s.namespace), client.MatchingLabels{ledgerLabel: "true"}); err != nil {
		return fmt.Errorf("listing quota books: %w", err)
	}
	for i := range books.Items {
		b := &books.Items[i]
		owner := b.Annotations[ledgerLabel]
		if owner == "" || inUse.Has(owner) || !s.lapsed(b) {
			continue
		}
		err := s.client.Delete(ctx, b, client.Preconditions{ResourceVersion: &b.ResourceVersion})
		switch {
		case err == nil:
			klog.FromContext(ctx).V(2).Info("Deleted quota book no TenantQuota uses", "book", klog.KObj(b), "owner", owner)
		case apierrors.IsNotFound(err) || apierrors.IsConflict(err): // gone, or written since: next time
		default:
			return fmt.Errorf("deleting quota book %s: %w", b.Name, err)
		}
	}
	return nil
}

// lapsed: none of the book's reservations counts any more. A damaged book
// holds nothing either (the next admission would start it afresh).
func (s *bookSweeper) lapsed(cm *corev1.ConfigMap) bool {
	entries, err := decodeBook(cm)
	if err != nil {
		return true
	}
	now := s.now()
	for _, r := range entries {
		if !r.lapsed(now) { // whatever a cache shows, it may count somewhere
			return false
		}
	}
	return true
}
