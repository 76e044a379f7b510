package idle

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
)

// tracked is a claim idle past its policy's duration.
type tracked struct {
	tenant string
	action gpuaas.IdleAction
	source string
	// since is the idleness warned about; a new one (the claim was used
	// in between) is warned again.
	since time.Time
	// warnedAt: the action is due Warning after it.
	warnedAt time.Time
	// done: the action was taken for this idleness.
	done bool
}

// tracker holds the claims idle past their policy, for the warnings not
// to repeat, the actions not to be taken twice, and the tenants' counts.
type tracker struct {
	mu     sync.Mutex
	claims map[types.NamespacedName]*tracked
	// dirty are the tenants whose IdleClaims condition is to be written.
	dirty map[string]bool
}

// observe records the claim idle since since under p; fresh when this is
// news (it was not tracked, or for another idleness or policy): it is to be
// warned now.
func (t *tracker) observe(key types.NamespacedName, p *policy, since, now time.Time) (tracked, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.claims == nil {
		t.claims = map[types.NamespacedName]*tracked{}
	}
	st := t.claims[key]
	if st != nil && st.since.Equal(since) && st.source == p.source && st.action == p.Action && st.tenant == p.tenant {
		return *st, false
	}
	old := st
	st = &tracked{tenant: p.tenant, action: p.Action, source: p.source, since: since, warnedAt: now}
	t.claims[key] = st
	if old != nil {
		t.changed(old.tenant, old.action)
	}
	t.changed(p.tenant, p.Action)
	return *st, true
}

func (t *tracker) done(key types.NamespacedName) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if st := t.claims[key]; st != nil {
		st.done = true
	}
}

// forget drops the claim; what was tracked of it, nil if nothing.
func (t *tracker) forget(key types.NamespacedName) *tracked {
	t.mu.Lock()
	defer t.mu.Unlock()
	st := t.claims[key]
	if st == nil {
		return nil
	}
	delete(t.claims, key)
	t.changed(st.tenant, st.action)
	return st
}

// changed sets gpuaas_idle_claims for the tenant and action and marks the
// tenant's condition to be written; t.mu held.
func (t *tracker) changed(tenant string, action gpuaas.IdleAction) {
	if t.dirty == nil {
		t.dirty = map[string]bool{}
	}
	t.dirty[tenant] = true
	n := 0
	for _, st := range t.claims {
		if st.tenant == tenant && st.action == action {
			n++
		}
	}
	idleClaims.WithLabelValues(tenant, string(action)).Set(float64(n))
}

// tenantClaims are the tenant's tracked claims, sorted.
func (t *tracker) tenantClaims(tenant string) []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []string
	for _, key := range slices.SortedFunc(maps.Keys(t.claims), func(a, b types.NamespacedName) int {
		return strings.Compare(a.String(), b.String())
	}) {
		if t.claims[key].tenant == tenant {
			out = append(out, key.String())
		}
	}
	return out
}

// dirtyTenants are the tenants whose condition is to be written, sorted.
func (t *tracker) dirtyTenants() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Sorted(maps.Keys(t.dirty))
}

func (t *tracker) clean(tenant string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.dirty, tenant)
}

// syncTenants writes the IdleClaims condition of each tenant whose
// tracked claims changed; one that fails stays to be written on the next
// reconcile.
func (r *Reconciler) syncTenants(ctx context.Context) error {
	var errs []error
	for _, tenant := range r.tracker.dirtyTenants() {
		if err := r.syncTenant(ctx, tenant); err != nil {
			errs = append(errs, err)
			continue
		}
		r.tracker.clean(tenant)
	}
	return errors.Join(errs...)
}

// namedInCondition bounds the claims the IdleClaims condition names.
const namedInCondition = 5

// syncTenant writes the tenant's IdleClaims condition from what is tracked.
// A conflict (the quota controller wrote its status meanwhile) is retried
// by the caller's requeue.
func (r *Reconciler) syncTenant(ctx context.Context, tenant string) error {
	if tenant == "" {
		return nil
	}
	var q gpuaas.TenantQuota
	if err := r.Client.Get(ctx, types.NamespacedName{Name: tenant}, &q); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("reading TenantQuota %s: %w", tenant, err)
	}
	cond := idleCondition(r.tracker.tenantClaims(tenant))
	cond.ObservedGeneration = q.Generation
	if old := meta.FindStatusCondition(q.Status.Conditions, cond.Type); old != nil &&
		old.Status == cond.Status && old.Message == cond.Message && old.Reason == cond.Reason {
		return nil
	}
	meta.SetStatusCondition(&q.Status.Conditions, cond)
	if err := r.Client.Status().Update(ctx, &q); err != nil {
		return fmt.Errorf("writing the IdleClaims condition of TenantQuota %s: %w", tenant, err)
	}
	return nil
}

func idleCondition(claims []string) metav1.Condition {
	if len(claims) == 0 {
		return metav1.Condition{Type: gpuaas.ConditionIdleClaims, Status: metav1.ConditionFalse,
			Reason: gpuaas.ReasonNoIdleClaims, Message: "no claim is idle past the idle policy's duration"}
	}
	named := claims[:min(len(claims), namedInCondition)]
	msg := fmt.Sprintf("%d claim(s) idle past the idle policy's duration: %s", len(claims), strings.Join(named, ", "))
	if len(claims) > len(named) {
		msg += fmt.Sprintf(" and %d more", len(claims)-len(named))
	}
	return metav1.Condition{Type: gpuaas.ConditionIdleClaims, Status: metav1.ConditionTrue, Reason: gpuaas.ReasonIdlePastPolicy, Message: msg}
}
