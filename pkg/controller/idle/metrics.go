package idle

import (
	"sync"

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
