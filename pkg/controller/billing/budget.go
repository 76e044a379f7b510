package billing

import (
	"context"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
)

// Event reasons of the budget.
const (
	ReasonBudgetThreshold = "BudgetThresholdCrossed"
	ReasonBudgetExhausted = "BudgetExhausted"
)

// budgetState is a tenant's budget as the last sync saw it, for the
// metrics: the amount and thresholds (the spend is computed at scrape).
type budgetState struct {
	amount     *big.Rat
	thresholds []int32
}

// spendOf is the cost of a tenant's period so far: its closed records and
// its open ones up to now.
func spendOf(u *gpuaas.TenantUsage, now time.Time) *big.Rat {
	cost := new(big.Rat)
	if u == nil {
		return cost
	}
	for _, t := range u.Status.Totals {
		cost.Add(cost, costOf(ratOf(t.UnitSeconds), t.Price))
	}
	for _, rec := range u.Status.Open {
		to := now
		if to.Before(rec.LastSeen.Time) {
			to = rec.LastSeen.Time
		}
		if end := u.Spec.End.Time; to.After(end) {
			to = end
		}
		cost.Add(cost, costOf(unitSecondsBetween(rec.Units, rec.Start.Time, to), rec.Price))
	}
	return cost
}

// crossed are the thresholds (percent) that spent reaches of amount.
func crossed(spent, amount *big.Rat, thresholds []int32) []int32 {
	var out []int32
	for _, t := range thresholds {
		limit := new(big.Rat).Mul(amount, big.NewRat(int64(t), 100))
		if spent.Cmp(limit) >= 0 {
			out = append(out, t)
		}
	}
	return out
}

// percentOf is spent / amount in percent, rounded down.
func percentOf(spent, amount *big.Rat) int64 {
	if amount.Sign() <= 0 {
		return 0
	}
	p := new(big.Rat).Quo(new(big.Rat).Mul(spent, big.NewRat(100, 1)), amount)
	return new(big.Int).Quo(p.Num(), p.Denom()).Int64()
}

// syncBudgets writes each TenantQuota's budget status and conditions from
// the records of the current period and raises an event for each
// threshold newly crossed. A threshold's event is raised once the status
// that lists it is written, so a new leader (which reads the status)
// raises none twice; one that crashes between the two loses the event, the
// condition and the metric still say it. behind reports a quota whose
// status another writer kept changing under every try: no error, the
// reconcile comes back soon.
func (r *Recorder) syncBudgets(ctx context.Context, now time.Time) (behind bool, err error) {
	var quotas gpuaas.TenantQuotaList
	if err := r.Client.List(ctx, &quotas); err != nil {
		return false, fmt.Errorf("listing TenantQuotas for their budgets: %w", err)
	}
	period, _, _ := Period(now)
	states := map[string]budgetState{}
	var errs []error
	for i := range quotas.Items {
		q := &quotas.Items[i]
		if b := q.Spec.Budget; b != nil && b.Amount.Sign() > 0 {
			states[q.Name] = budgetState{amount: priceRat(b.Amount), thresholds: b.EffectiveThresholds()}
		}
		err := r.syncBudget(ctx, q, period, now)
		switch {
		case apierrors.IsConflict(err):
			klog.FromContext(ctx).V(2).Info("Another writer kept changing the TenantQuota's status; writing its budget again soon", "tenantQuota", q.Name, "err", err)
			behind = true
		case err != nil:
			errs = append(errs, err)
		}
	}
	r.budgets = states
	return behind, errors.Join(errs...)
}

// budgetWriteBackoff: the quota reconciler writes the same status (its
// usage and conditions), often while a tenant's claims move, so a write on
// the live object may still meet a newer one; a few tries, then the
// reconcile comes back (budgetBehindRetry).
var budgetWriteBackoff = wait.Backoff{Steps: 4, Duration: 10 * time.Millisecond, Factor: 2, Jitter: 0.2}

// syncBudget brings one quota's budget status up to date; on a conflict
// (the quota reconciler wrote meanwhile) it tries again on the live object,
// and returns the conflict if every try met one.
func (r *Recorder) syncBudget(ctx context.Context, q *gpuaas.TenantQuota, period string, now time.Time) error {
	first := true
	err := retry.RetryOnConflict(budgetWriteBackoff, func() error {
		if !first {
			var live gpuaas.TenantQuota
			if err := r.Live.Get(ctx, client.ObjectKeyFromObject(q), &live); err != nil {
				return fmt.Errorf("reading TenantQuota %s: %w", q.Name, err)
			}
			q = &live
		}
		first = false
		next, fresh := r.budgetStatus(q, period, now)
		if next == nil {
			return nil
		}
		update := q.DeepCopy()
		update.Status = *next
		if err := r.Client.Status().Update(ctx, update); err != nil {
			return err
		}
		r.budgetEvents(update, fresh)
		return nil
	})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("writing the budget status of TenantQuota %s: %w", q.Name, err)
	}
	return nil
}

// budgetStatus is the quota's status with its budget brought up to date,
// and the thresholds crossed since the status last said; nil when nothing
// changes.
func (r *Recorder) budgetStatus(q *gpuaas.TenantQuota, period string, now time.Time) (*gpuaas.TenantQuotaStatus, []int32) {
	status := q.Status.DeepCopy()
	b := q.Spec.Budget
	if b == nil || b.Amount.Sign() <= 0 {
		if status.Budget == nil && meta.FindStatusCondition(status.Conditions, gpuaas.ConditionBudgetExhausted) == nil &&
			meta.FindStatusCondition(status.Conditions, gpuaas.ConditionBudgetThresholdReached) == nil {
			return nil, nil
		}
		status.Budget = nil
		meta.RemoveStatusCondition(&status.Conditions, gpuaas.ConditionBudgetExhausted)
		meta.RemoveStatusCondition(&status.Conditions, gpuaas.ConditionBudgetThresholdReached)
		return status, nil
	}
	amount := priceRat(b.Amount)
	spent := spendOf(r.usages[UsageName(q.Name, period)], now)
	reached := crossed(spent, amount, b.EffectiveThresholds())
	var before []int32
	if old := q.Status.Budget; old != nil && old.Period == period {
		before = old.ThresholdsCrossed
	}
	var fresh []int32
	for _, t := range reached {
		if !slices.Contains(before, t) {
			fresh = append(fresh, t)
		}
	}
	status.Budget = &gpuaas.BudgetStatus{Period: period, Spent: money(spent), Amount: b.Amount,
		Currency: r.Currency, Percent: percentOf(spent, amount), ThresholdsCrossed: reached}
	for _, c := range budgetConditions(q, status.Budget) {
		c.ObservedGeneration = q.Generation
		meta.SetStatusCondition(&status.Conditions, c)
	}
	// Written when anything but the spend changed, or the spend moved by
	// a whole percent: the spend grows at every reconcile, and a status
	// write per claim event and budgeted tenant would be a write storm.
	if old := q.Status.Budget; old != nil {
		unchanged := *status.Budget
		unchanged.Spent = old.Spent
		candidate := status.DeepCopy()
		candidate.Budget = &unchanged
		if equality.Semantic.DeepEqual(&q.Status, candidate) {
			return nil, nil
		}
	}
	return status, fresh
}

// budgetConditions are BudgetThresholdReached and BudgetExhausted.
func budgetConditions(q *gpuaas.TenantQuota, st *gpuaas.BudgetStatus) []metav1.Condition {
	b := q.Spec.Budget
	// The percent, not the exact spend (status.budget.spent): a message
	// that changed at every reconcile would be a status write each time.
	spend := fmt.Sprintf("spent %d%% of the budget of %s %s for %s", st.Percent, b.Amount.String(), st.Currency, st.Period)
	threshold := metav1.Condition{Type: gpuaas.ConditionBudgetThresholdReached, Status: metav1.ConditionFalse,
		Reason: gpuaas.ReasonBelowThresholds, Message: spend + "; no threshold reached"}
	if n := len(st.ThresholdsCrossed); n > 0 {
		threshold.Status, threshold.Reason = metav1.ConditionTrue, gpuaas.ReasonThresholdCrossed
		threshold.Message = fmt.Sprintf("%s; threshold %d%% reached", spend, st.ThresholdsCrossed[n-1])
	}
	exhausted := metav1.Condition{Type: gpuaas.ConditionBudgetExhausted, Status: metav1.ConditionFalse,
		Reason: gpuaas.ReasonWithinBudget, Message: spend}
	if st.Percent >= 100 {
		exhausted.Status, exhausted.Reason = metav1.ConditionTrue, gpuaas.ReasonBudgetExhausted
		if b.Action == gpuaas.BudgetActionRefuseNewClaims {
			exhausted.Message = spend + "; new claims are refused until the period ends or the budget is raised (existing claims are not touched)"
		} else {
			exhausted.Message = spend + "; action Notify: new claims are still admitted"
		}
	}
	return []metav1.Condition{threshold, exhausted}
}

// budgetEvents raises one event per threshold newly crossed on the quota.
func (r *Recorder) budgetEvents(q *gpuaas.TenantQuota, fresh []int32) {
	if r.Events == nil || len(fresh) == 0 {
		return
	}
	st := q.Status.Budget
	for _, t := range fresh {
		reason, typ := ReasonBudgetThreshold, corev1.EventTypeNormal
		if t >= 100 {
			reason, typ = ReasonBudgetExhausted, corev1.EventTypeWarning
		}
		r.Events.Eventf(q, nil, typ, reason, "Budget",
			"TenantQuota %s crossed %d%% of its budget for %s: spent %s %s of %s", q.Name, t, st.Period, st.Spent, st.Currency, st.Amount.String())
	}
}

// thresholdLabel is a threshold as a metric label ("80").
func thresholdLabel(t int32) string { return strconv.Itoa(int(t)) }

// budgetMetrics are the tenants' budgets with their spend now, for the
// collector.
func (r *Recorder) budgetMetrics() map[string]budgetMetric {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]budgetMetric{}
	if !r.loaded {
		return out
	}
	now := r.now()
	period, _, _ := Period(now)
	for tenant, st := range r.budgets {
		spent := spendOf(r.usages[UsageName(tenant, period)], now)
		out[tenant] = budgetMetric{amount: st.amount, spent: spent, thresholds: st.thresholds}
	}
	return out
}

type budgetMetric struct {
	amount, spent *big.Rat
	thresholds    []int32
}
