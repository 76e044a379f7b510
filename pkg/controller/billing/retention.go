package billing

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/big"
	"slices"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
)

// retiredUsage is what the TenantUsages this process deleted held, per
// tenant, profile (or shape) and GPU model: kept in the counters so that
// deleting an old month never makes them go down (Prometheus would read
// a reset).
type retiredUsage struct{ unitSeconds, cost, idle *big.Rat }

// expired: u's period ended more than months months before now's began.
// The current and the previous month never are (months >= 1).
func expired(u *gpuaas.TenantUsage, months int, now time.Time) bool {
	if months <= 0 {
		return false
	}
	_, current, _ := Period(now)
	return u.Spec.Start.Time.Before(current.AddDate(0, -months, 0))
}

// retire deletes the TenantUsages past RetentionMonths: closed periods
// only (none open, nothing left to write), counted and logged.
func (r *Recorder) retire(ctx context.Context, now time.Time) error {
	logger := klog.FromContext(ctx)
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(r.usages)) {
		u := r.usages[name]
		if !expired(u, r.RetentionMonths, now) || len(u.Status.Open) > 0 || r.dirty[name] {
			continue
		}
		obj := &gpuaas.TenantUsage{ObjectMeta: metav1.ObjectMeta{Name: name}}
		if err := r.Client.Delete(ctx, obj); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("deleting TenantUsage %s past the retention of %d months: %w", name, r.RetentionMonths, err))
			continue
		}
		r.keepInCounters(u)
		delete(r.usages, name)
		logger.Info("Deleted a TenantUsage past the billing retention", "tenantUsage", name, "tenant", u.Spec.Tenant,
			"period", u.Spec.Period, "retentionMonths", r.RetentionMonths, "unitSeconds", u.Status.UnitSeconds, "cost", u.Status.Cost)
	}
	return errors.Join(errs...)
}

// keepInCounters folds a deleted TenantUsage's totals into retired.
func (r *Recorder) keepInCounters(u *gpuaas.TenantUsage) {
	if r.retired == nil {
		r.retired, r.deleted = map[costKey]retiredUsage{}, map[string]int64{}
	}
	r.deleted[u.Spec.Tenant]++
	for _, t := range u.Status.Totals {
		k := keyOf(u.Spec.Tenant, t.Profile, t.Shape, t.GpuModel)
		ret, ok := r.retired[k]
		if !ok {
			ret = retiredUsage{unitSeconds: new(big.Rat), cost: new(big.Rat), idle: new(big.Rat)}
		}
		us := ratOf(t.UnitSeconds)
		ret.unitSeconds.Add(ret.unitSeconds, us)
		ret.cost.Add(ret.cost, costOf(us, t.Price))
		ret.idle.Add(ret.idle, ratOf(t.IdleUnitSeconds))
		r.retired[k] = ret
	}
}
