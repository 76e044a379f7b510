package admission

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/quota"
)

// liveNamespace is a namespace read from the API, until the cache has it.
type liveNamespace struct {
	ns   *corev1.Namespace // nil: it does not exist
	read time.Time
}

// liveNamespaceTTL bounds how long a live read stands in for the cache,
// which normally catches up within a second.
const liveNamespaceTTL = 30 * time.Second

// tenancy is the quotas and namespaces as the accountant charges them: a
// snapshot, rebuilt when either changes (tenancyGen).
type tenancy struct {
	gen     int64
	quotas  []*gpuaas.TenantQuota // oldest first
	tenants map[string]quota.Tenant
	invalid map[string]string // quota name -> why it is not enforced
	assign  quota.Assignment
	owner   map[string]string // namespace -> quota name
	// budgets are the exhausted budgets whose action refuses new claims,
	// by quota name.
	budgets map[string]exhaustedBudget
}

// exhaustedBudget is a budget the billing recorder found spent, in its
// period.
type exhaustedBudget struct{ period, message string }

// budgetRefusal is why the tenant's new claims are refused for its budget,
// or "": the recorder found the budget of the current period exhausted and
// its action is RefuseNewClaims. One of a past period refuses nothing (a
// new month starts with a new budget, before the recorder says so).
func (t *tenancy) budgetRefusal(owner string, now time.Time) string {
	b, ok := t.budgets[owner]
	if !ok || b.period != now.UTC().Format("2006-01") {
		return ""
	}
	return b.message
}

// budgetOf is the quota's exhausted budget that refuses new claims, if any.
func budgetOf(q *gpuaas.TenantQuota) (exhaustedBudget, bool) {
	b, st := q.Spec.Budget, q.Status.Budget
	if b == nil || b.Action != gpuaas.BudgetActionRefuseNewClaims || st == nil {
		return exhaustedBudget{}, false
	}
	c := meta.FindStatusCondition(q.Status.Conditions, gpuaas.ConditionBudgetExhausted)
	if c == nil || c.Status != metav1.ConditionTrue {
		return exhaustedBudget{}, false
	}
	// Judged against the budget it was computed with: a raised budget
	// admits again at once.
	if st.Amount.Cmp(b.Amount) != 0 {
		return exhaustedBudget{}, false
	}
	return exhaustedBudget{period: st.Period, message: fmt.Sprintf(
		"the budget of TenantQuota %q for %s is exhausted (spent %s %s of %s): new claims are refused until the period ends or the budget is raised",
		q.Name, st.Period, st.Spent, st.Currency, b.Amount.String())}, true
}

// BudgetStateChanged: the budget status the claim webhook acts on differs.
func BudgetStateChanged(o, q *gpuaas.TenantQuota) bool {
	ob, ook := budgetOf(o)
	nb, nok := budgetOf(q)
	return ook != nok || ob != nb
}

func (a *Accountant) tenancyLocked(ctx context.Context) (*tenancy, error) {
	gen := a.tenancyGen.Load()
	if a.ten != nil && a.ten.gen == gen {
		return a.ten, nil
	}
	var quotas gpuaas.TenantQuotaList
	if err := a.reader.List(ctx, &quotas, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("listing TenantQuotas: %w", err)
	}
	var nsList corev1.NamespaceList
	if err := a.reader.List(ctx, &nsList, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("listing Namespaces: %w", err)
	}
	a.ten = newTenancy(gen, quotas.Items, nsList.Items)
	return a.ten, nil
}

// newTenancy resolves which quota each namespace is charged to; a quota
// that fails validation is kept (its namespaces are refused) and flagged.
func newTenancy(gen int64, quotas []gpuaas.TenantQuota, namespaces []corev1.Namespace) *tenancy {
	ten := &tenancy{gen: gen, tenants: map[string]quota.Tenant{}, invalid: map[string]string{}, owner: map[string]string{},
		budgets: map[string]exhaustedBudget{}}
	ten.quotas, ten.assign = quota.Resolve(quotas, namespaces)
	for _, q := range ten.quotas {
		ten.tenants[q.Name] = quota.TenantFromQuota(q)
		if b, ok := budgetOf(q); ok {
			ten.budgets[q.Name] = b
		}
		if errs := q.Validate(); len(errs) > 0 {
			ten.invalid[q.Name] = errs.ToAggregate().Error()
		}
	}
	for q, list := range ten.assign.Namespaces {
		for _, ns := range list {
			ten.owner[ns] = q
		}
	}
	return ten
}

// ownerLocked is the quota a namespace is charged to, or "" (it needs no
// lock, only a tenancy snapshot). A namespace the cache has not seen yet
// (created a moment ago) is taken from the live read prefetchNamespace made
// before, so a label selector
// cannot be dodged by racing the informer; without one (a caller that did
// not prefetch) it is read from the API here.
func (a *Accountant) ownerLocked(ctx context.Context, ten *tenancy, namespace string) (string, error) {
	if q, ok := ten.owner[namespace]; ok {
		return q, nil
	}
	var ns corev1.Namespace
	err := a.reader.Get(ctx, types.NamespacedName{Name: namespace}, &ns)
	if apierrors.IsNotFound(err) {
		var live *corev1.Namespace
		if live, err = a.liveNamespace(ctx, namespace); live != nil {
			ns = *live
		}
	}
	if err != nil && !apierrors.IsNotFound(err) {
		return "", fmt.Errorf("reading namespace %s: %w", namespace, err)
	}
	owner, _ := quota.Owner(ten.quotas, namespace, ns.Labels)
	if owner == nil {
		return "", nil
	}
	return owner.Name, nil
}

// prefetchNamespace reads from the API, without holding mu, a namespace the
// cache has not seen yet, for ownerLocked.
func (a *Accountant) prefetchNamespace(ctx context.Context, namespace string) error {
	var ns corev1.Namespace
	err := a.reader.Get(ctx, types.NamespacedName{Name: namespace}, &ns)
	if !apierrors.IsNotFound(err) {
		return nil // cached (or the cache fails, which ownerLocked reports)
	}
	a.nsMu.Lock()
	hit, ok := a.live[namespace]
	a.nsMu.Unlock()
	if ok && a.now().Sub(hit.read) < liveNamespaceTTL {
		return nil
	}
	_, err = a.readLive(ctx, namespace)
	return err
}

// liveNamespace is the prefetched namespace, or a live read now; nil when
// it does not exist.
func (a *Accountant) liveNamespace(ctx context.Context, namespace string) (*corev1.Namespace, error) {
	a.nsMu.Lock()
	hit, ok := a.live[namespace]
	a.nsMu.Unlock()
	if ok && a.now().Sub(hit.read) < liveNamespaceTTL {
		return hit.ns, nil
	}
	return a.readLive(ctx, namespace)
}

func (a *Accountant) readLive(ctx context.Context, namespace string) (*corev1.Namespace, error) {
	var ns corev1.Namespace
	err := a.apiReader.Get(ctx, types.NamespacedName{Name: namespace}, &ns)
	if err != nil && !apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("reading namespace %s: %w", namespace, err)
	}
	entry := liveNamespace{read: a.now()}
	if err == nil {
		entry.ns = &ns
	}
	a.nsMu.Lock()
	defer a.nsMu.Unlock()
	for name, e := range a.live { // few entries: each lives until the cache catches up
		if a.now().Sub(e.read) >= liveNamespaceTTL {
			delete(a.live, name)
		}
	}
	a.live[namespace] = entry
	return entry.ns, nil
}
