package controller

import (
	"context"
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller/admission"
	"github.com/gpuaas/gpu-dra-driver/pkg/quota"
)

// quotaReconciler writes a TenantQuota's status from the claims in its
// namespaces (allocated ones trued up from their allocation), flags invalid
// specs, namespace conflicts and usage over the limits, and keeps the
// tenant's metrics current (the billing counter is the billing package's,
// derived from its records).
type quotaReconciler struct {
	client client.Client
	acct   *admission.Accountant
	resync time.Duration
}

func (r *quotaReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var q gpuaas.TenantQuota
	if err := r.client.Get(ctx, req.NamespacedName, &q); err != nil {
		if apierrors.IsNotFound(err) {
			deleteTenantMetrics(req.Name)
			return reconcile.Result{}, nil
		}
		return reconcile.Result{}, fmt.Errorf("reading TenantQuota %s: %w", req.Name, err)
	}
	rep, err := r.acct.Report(ctx, q.Name)
	if err != nil {
		return reconcile.Result{}, err
	}
	status := quotaStatus(&q, rep)
	setTenantMetrics(&q, rep, borrowed(rep))
	if !equality.Semantic.DeepEqual(&q.Status, status) {
		q.Status = *status
		err := r.client.Status().Update(ctx, &q)
		if apierrors.IsConflict(err) {
			// The cache was behind: an ordinary race, not a failure
			// (counted as a reconcile error, it raised the alert on
			// healthy clusters). Decided again on what is new.
			return reconcile.Result{RequeueAfter: time.Second}, nil
		}
		if err != nil {
			return reconcile.Result{}, fmt.Errorf("updating status of TenantQuota %s: %w", q.Name, err)
		}
	}
	return reconcile.Result{RequeueAfter: r.resync}, nil
}

// quotaStatus renders the status (conditions keep their transition times).
func quotaStatus(q *gpuaas.TenantQuota, rep admission.TenantReport) *gpuaas.TenantQuotaStatus {
	status := q.Status.DeepCopy()
	status.ObservedGeneration = q.Generation
	status.Namespaces = rep.Namespaces
	status.Used = usageOf(rep.Usage.Used)
	status.Reserved = usageOf(rep.Usage.Reserved)
	status.Borrowed = usageOf(borrowed(rep))
	status.ClaimsCounted = int32(rep.Usage.Claims)
	for _, c := range quotaConditions(rep) {
		c.ObservedGeneration = q.Generation
		meta.SetStatusCondition(&status.Conditions, c)
	}
	return status
}

func quotaConditions(rep admission.TenantReport) []metav1.Condition {
	ready := condition(gpuaas.ConditionReady, true, gpuaas.ReasonEnforced, "limits are enforced on new ResourceClaims")
	if rep.Invalid != "" {
		ready = condition(gpuaas.ConditionReady, false, gpuaas.ReasonInvalidSpec,
			"every claim in the quota's namespaces is refused until this is fixed: "+rep.Invalid)
	}
	conflict := condition(gpuaas.ConditionNamespaceConflict, false, gpuaas.ReasonNoConflict, "no other TenantQuota claims these namespaces")
	if len(rep.Conflicts) > 0 {
		conflict = condition(gpuaas.ConditionNamespaceConflict, true, gpuaas.ReasonConflict, strings.Join(rep.Conflicts, "; "))
	}
	over := condition(gpuaas.ConditionOverQuota, false, gpuaas.ReasonWithinLimits, "usage is within the limits")
	if exceeded := overLimits(rep); len(exceeded) > 0 {
		over = condition(gpuaas.ConditionOverQuota, true, gpuaas.ReasonExceeded,
			strings.Join(exceeded, "; ")+"; new claims are refused until usage drops")
	}
	return []metav1.Condition{ready, conflict, over}
}

// borrowed is how far usage exceeds the own limits (units and memory).
func borrowed(rep admission.TenantReport) quota.Charge {
	total := rep.Usage.Total()
	var b quota.Charge
	if l := rep.Tenant.Limits.Units; l != nil && total.Units.Cmp(*l) > 0 {
		b.Units = total.Units.Sub(*l)
	}
	if l := rep.Tenant.Limits.Memory; l != nil && total.Memory > *l {
		b.Memory = total.Memory - *l
	}
	return b
}

// overLimits lists resources whose usage is beyond what the tenant may
// hold even with borrowing: the limit was lowered, or an allocation cost
// more than the worst case admitted (a device republished with another
// weight).
func overLimits(rep admission.TenantReport) []string {
	t, total := rep.Tenant, rep.Usage.Total()
	var out []string
	for class, limit := range t.Limits.Devices {
		if n := total.Devices[class]; n > limit {
			out = append(out, fmt.Sprintf("devices of profile %q: %d held, limit %d", class, n, limit))
		}
	}
	for name, limit := range t.Limits.Shapes {
		if n := total.Shapes[name]; n > limit {
			out = append(out, fmt.Sprintf("instances of shape %q: %d held, limit %d", name, n, limit))
		}
	}
	if l := t.Limits.Units; l != nil && total.Units.Cmp(*l) > 0 && !mayBorrow(t, t.Borrow.Units, total.Units.Sub(*l)) {
		out = append(out, fmt.Sprintf("gpuUnits: %s held, limit %s", total.Units, *l))
	}
	if l := t.Limits.Memory; l != nil && total.Memory > *l && !mayBorrow(t, unitsPtr(t.Borrow.Memory), quota.WholeUnits(total.Memory-*l)) {
		out = append(out, fmt.Sprintf("gpuMemory: %s held, limit %s", quota.FormatMemory(total.Memory), quota.FormatMemory(*l)))
	}
	return out
}

func mayBorrow(t quota.Tenant, limit *quota.Units, amount quota.Units) bool {
	return t.Cohort != "" && (limit == nil || amount.Cmp(*limit) <= 0)
}

func unitsPtr(n *int64) *quota.Units {
	if n == nil {
		return nil
	}
	u := quota.WholeUnits(*n)
	return &u
}

func usageOf(c quota.Charge) gpuaas.QuotaUsage {
	units := c.Units.CeilQuantity()
	u := gpuaas.QuotaUsage{GpuUnits: &units, GpuMemory: resource.NewQuantity(c.Memory, resource.BinarySI)}
	u.Devices = nonZero(c.Devices)
	u.Shapes = nonZero(c.Shapes)
	return u
}

// nonZero is m without its zero counts; nil when none is left.
func nonZero(m map[string]int64) map[string]int64 {
	var out map[string]int64
	for k, n := range m {
		if n == 0 {
			continue
		}
		if out == nil {
			out = map[string]int64{}
		}
		out[k] = n
	}
	return out
}

func condition(typ string, ok bool, reason, msg string) metav1.Condition {
	status := metav1.ConditionFalse
	if ok {
		status = metav1.ConditionTrue
	}
	return metav1.Condition{Type: typ, Status: status, Reason: reason, Message: msg}
}
