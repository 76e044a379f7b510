package idle

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
)

// Retry periods: evidence that may come back without any change the
// reconciler watches (a stalled plugin's Lease renewed), and an action
// refused or failed.
const (
	recheckAfter = time.Minute
	retryAfter   = time.Minute
)

// Reconciler acts on the idle claims of our driver (see the package doc).
type Reconciler struct {
	// Client reads claims, TenantQuotas, GpuProfiles and Namespaces (the
	// manager's cache), evicts pods, patches Workloads and writes the
	// TenantQuotas' IdleClaims condition.
	Client client.Client
	// Live reads what is not cached: the plugins' use Leases, pods, their
	// owners and Kueue Workloads.
	Live client.Reader
	// Events records the warnings and actions on claims and pods.
	Events events.EventRecorder
	// LeaseNamespace holds the plugins' use Leases: the chart's namespace.
	LeaseNamespace string
	// Kueue: the Kueue integration is on (and so the RBAC on Workloads);
	// without it Deactivate notifies.
	Kueue bool
	Now   func() time.Time

	tracker tracker
}

// Reconcile looks at one claim: whether it is idle past its policy, and
// what is due: a warning, the action, or nothing until the next deadline;
// then writes the IdleClaims condition of the tenants whose count changed.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	res, err := r.reconcile(ctx, req)
	if syncErr := r.syncTenants(ctx); syncErr != nil {
		if !apierrors.IsConflict(syncErr) {
			return res, errors.Join(err, syncErr)
		}
		// The quota controller wrote the status meanwhile: an ordinary
		// race, written again on what is new.
		res = reconcile.Result{RequeueAfter: time.Second}
	}
	return res, err
}

func (r *Reconciler) reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	logger := klog.FromContext(ctx).WithValues("claim", req.NamespacedName)
	ctx = klog.NewContext(ctx, logger)
	var claim resourceapi.ResourceClaim
	if err := r.Client.Get(ctx, req.NamespacedName, &claim); err != nil {
		if apierrors.IsNotFound(err) {
			r.forget(ctx, req.NamespacedName, "the claim is gone")
			return reconcile.Result{}, nil
		}
		return reconcile.Result{}, fmt.Errorf("reading claim %s: %w", req.NamespacedName, err)
	}
	if claim.DeletionTimestamp != nil {
		r.forget(ctx, req.NamespacedName, "the claim is being deleted")
		return reconcile.Result{}, nil
	}
	ours := ourDevices(&claim)
	if len(ours) == 0 {
		r.forget(ctx, req.NamespacedName, "no device of ours is allocated")
		return reconcile.Result{}, nil
	}
	p, why, err := resolvePolicy(ctx, r.Client, &claim, ours)
	if err != nil {
		return reconcile.Result{}, err
	}
	if p == nil {
		r.forget(ctx, req.NamespacedName, why)
		return reconcile.Result{}, nil
	}
	seedSeries(p.tenant, p.Action)
	idle, why := claimIdleness(&claim, ours)
	if idle == nil {
		// The plugin's next change of a condition brings the claim back.
		r.forget(ctx, req.NamespacedName, why)
		return reconcile.Result{}, nil
	}
	now := r.Now()
	warnAt := idle.since.Add(p.Duration.Duration)
	if now.Before(warnAt) {
		r.forget(ctx, req.NamespacedName, "idle for less than the policy's duration")
		return reconcile.Result{RequeueAfter: warnAt.Sub(now)}, nil
	}
	why, err = samplersCurrent(ctx, r.Live, r.LeaseNamespace, idle, now)
	if err != nil {
		return reconcile.Result{}, err
	}
	if why != "" {
		logger.V(2).Info("Not acting on an idle claim: its use is not known to be current", "why", why)
		r.forget(ctx, req.NamespacedName, why)
		return reconcile.Result{RequeueAfter: recheckAfter}, nil
	}
	return r.idlePastDuration(ctx, &claim, p, idle, now)
}

// idlePastDuration warns, then acts once the warning period is over.
func (r *Reconciler) idlePastDuration(ctx context.Context, claim *resourceapi.ResourceClaim, p *policy, idle *idleness, now time.Time) (reconcile.Result, error) {
	logger := klog.FromContext(ctx)
	key := types.NamespacedName{Namespace: claim.Namespace, Name: claim.Name}
	st, fresh := r.tracker.observe(key, p, idle.since, now)
	actAt := st.warnedAt.Add(p.warning())
	why := r.why(claim, p, idle)
	if fresh {
		pods, err := r.reservedPods(ctx, claim)
		if err != nil {
			// Not warned: the retry must find it news again.
			r.tracker.forget(key)
			return reconcile.Result{}, err
		}
		note := fmt.Sprintf("%s; %s at %s", why, actionText(p.Action), actAt.UTC().Format(time.RFC3339))
		r.notify(claim, pods, ReasonIdleWarning, note)
		logger.Info("Idle claim warned", "tenant", p.tenant, "policy", p.source, "action", p.Action, "at", actAt, "why", why)
	}
	if st.done {
		return reconcile.Result{}, nil
	}
	if now.Before(actAt) {
		return reconcile.Result{RequeueAfter: actAt.Sub(now)}, nil
	}
	result, err := r.act(ctx, claim, p, why)
	idleActions.WithLabelValues(p.tenant, string(p.Action), result).Inc()
	switch {
	case errors.Is(err, errRefused):
		logger.Info("Idle claim's eviction refused; retried later", "policy", p.source, "why", why, "err", err)
		return reconcile.Result{RequeueAfter: retryAfter}, nil
	case err != nil:
		r.notify(claim, nil, ReasonIdleActionFailed, fmt.Sprintf("%s; %s failed, retried: %v", why, p.Action, err))
		return reconcile.Result{}, err
	}
	r.tracker.done(key)
	logger.Info("Acted on idle claim", "tenant", p.tenant, "policy", p.source, "action", p.Action, "result", result, "why", why)
	return reconcile.Result{}, nil
}

// why is the one line each warning and action says: the policy, the
// window and the measured use.
func (r *Reconciler) why(claim *resourceapi.ResourceClaim, p *policy, idle *idleness) string {
	return fmt.Sprintf("claim %s idle since %s below %s for %s (policy %s); measured: %s",
		claim.Name, idle.since.UTC().Format(time.RFC3339), thresholdText(p), p.Duration.Duration, p.source, idle.use)
}

// act does the policy's action and says how it went (the metric's result).
func (r *Reconciler) act(ctx context.Context, claim *resourceapi.ResourceClaim, p *policy, why string) (string, error) {
	pods, err := r.reservedPods(ctx, claim)
	if err != nil {
		return resultFailed, err
	}
	switch p.Action {
	case gpuaas.IdleActionEvict:
		if len(pods) == 0 {
			r.notify(claim, nil, ReasonIdleNotified, why+"; not evicted: no pod of its status.reservedFor exists with the UID reserved, notified instead")
			return resultNotified, nil
		}
		if err := r.evict(ctx, claim, pods, why); err != nil {
			if errors.Is(err, errRefused) {
				return resultRefused, err
			}
			return resultFailed, err
		}
		r.event(claim, nil, corev1.EventTypeWarning, ReasonIdleEvicted, "Evict", fmt.Sprintf("%s; %d pod(s) evicted", why, len(pods)))
		return resultDone, nil
	case gpuaas.IdleActionDeactivate:
		if !r.Kueue {
			r.notify(claim, pods, ReasonIdleNotified, why+"; not deactivated: the controller's Kueue integration is off (--kueue), notified instead")
			return resultNotified, nil
		}
		without, err := r.deactivate(ctx, claim, pods, why)
		if err != nil {
			return resultFailed, err
		}
		if len(without) > 0 || len(pods) == 0 {
			r.notify(claim, without, ReasonIdleNotified, why+"; not deactivated: no Kueue Workload owns the pod or its Job, notified instead")
			return resultNotified, nil
		}
		r.event(claim, nil, corev1.EventTypeWarning, ReasonIdleDeactivated, "Deactivate", why+"; the pods' Kueue Workloads deactivated")
		return resultDone, nil
	default:
		r.notify(claim, pods, ReasonIdleNotified, why+"; notified (the policy's action is Notify): nothing is stopped")
		return resultDone, nil
	}
}

// forget drops what was tracked of the claim: it is not idle past its
// policy now (its tenant's condition is written after the reconcile).
func (r *Reconciler) forget(ctx context.Context, key types.NamespacedName, why string) {
	if st := r.tracker.forget(key); st != nil {
		klog.FromContext(ctx).V(2).Info("Idle claim no longer tracked", "tenant", st.tenant, "why", why)
	}
}
