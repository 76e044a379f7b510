package idle

import (
	"sync"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"

	"github.com/prometheus/client_golang/prometheus"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

// Results of an action (gpuaas_idle_actions_total's result label).
const (
	resultDone = "done"
	// resultRefused: the Eviction API refused (a PodDisruptionBudget);
	// retried later.
	resultRefused = "refused"
	// resultNotified: a Deactivate found no Kueue Workload, or an Evict
	// no pod, and notified.
	resultNotified = "notified"
	resultFailed   = "failed"
)

var (
	idleClaims = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "gpuaas_idle_claims",
		Help: "Allocated ResourceClaims idle past their idle policy's duration (warned, or acted on), per tenant and the policy's action.",
	}, []string{"tenant", "action"})
	idleActions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gpuaas_idle_actions_total",
		Help: "Actions of the idle policy on idle claims, per tenant, action (Notify, Deactivate, Evict) and result (done, refused, notified, failed).",
	}, []string{"tenant", "action", "result"})

	registerOnce sync.Once
)

// RegisterMetrics adds the idle policy's metrics to controller-runtime's
// registry once per process.
func RegisterMetrics() {
	registerOnce.Do(func() { ctrlmetrics.Registry.MustRegister(idleClaims, idleActions) })
}

// seedSeries makes a tenant's series exist at 0 once a claim of its falls
// under a policy with action: "no idle claim" and "no action" are answers a
// dashboard and an alert read, and an absent series is none (a renamed
// metric and a quiet one would look alike).
func seedSeries(tenant string, action gpuaas.IdleAction) {
	idleClaims.WithLabelValues(tenant, string(action))
	for _, result := range resultsOf(action) {
		idleActions.WithLabelValues(tenant, string(action), result)
	}
}

// resultsOf are the results an action can have.
func resultsOf(action gpuaas.IdleAction) []string {
	switch action {
	case gpuaas.IdleActionEvict:
		return []string{resultDone, resultRefused, resultNotified, resultFailed}
	case gpuaas.IdleActionDeactivate:
		return []string{resultDone, resultNotified, resultFailed}
	default:
		return []string{resultDone, resultFailed}
	}
}
