package webhook

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	quotaadmission "github.com/gpuaas/gpu-dra-driver/pkg/controller/admission"
	"github.com/gpuaas/gpu-dra-driver/pkg/quota"
)

// What the webhooks decided, registered once per process on
// controller-runtime's registry (a controller restarted in the same
// process, in tests, keeps counting). The quota reconciler starts and
// deletes a tenant's series (StartTenantSeries, DeleteTenantSeries).
var (
	admissions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gpuaas_claim_admissions_total",
		Help: "ResourceClaims the quota webhook decided on, by tenant and result (admitted, denied, overruled: over quota but admitted because Kueue admitted its workload).",
	}, []string{"tenant", "result"})
	denials = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gpuaas_claim_denials_total",
		Help: "ResourceClaims denied, by tenant and the first resource exceeded.",
	}, []string{"tenant", "resource"})
	alternativesDropped = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gpuaas_claim_alternatives_dropped_total",
		Help: "firstAvailable alternatives the alternatives webhook dropped from new ResourceClaims because the tenant's quota did not admit them, by tenant.",
	}, []string{"tenant"})
	// A quota check that fails answers the webhook with an error, which
	// the API server turns into a refused claim (failurePolicy Fail) and
	// controller-runtime counts as a 200: this says so.
	admissionErrors = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "gpuaas_claim_admission_errors_total",
		Help: "ResourceClaim admissions that failed (the claim is refused and retried): the quota could not be checked.",
	})

	registerOnce sync.Once
)

// RegisterMetrics registers the webhooks' metrics, once per process.
func RegisterMetrics() {
	registerOnce.Do(func() {
		ctrlmetrics.Registry.MustRegister(admissions, denials, alternativesDropped, admissionErrors)
	})
}

func recordAdmission(tenant string, adm quotaadmission.Admission) {
	if tenant == "" {
		tenant = "none"
	}
	if adm.OverruledBy != "" {
		admissions.WithLabelValues(tenant, "overruled").Inc()
		return
	}
	if adm.Allowed {
		admissions.WithLabelValues(tenant, "admitted").Inc()
		return
	}
	admissions.WithLabelValues(tenant, "denied").Inc()
	denials.WithLabelValues(tenant, adm.Resource).Inc()
}

// StartTenantSeries creates, at 0, the denial and admission series a
// tenant's limits can produce. A counter's series otherwise appears at its
// first increment, already at 1, and increase() never sees that first
// denial: a tenant refused once was never reported at its limit.
func StartTenantSeries(tenant string, l quota.Limits) {
	for _, result := range []string{"admitted", "denied", "overruled"} {
		admissions.WithLabelValues(tenant, result).Add(0)
	}
	if l.Units != nil {
		denials.WithLabelValues(tenant, quota.ResourceGpuUnits).Add(0)
	}
	if l.Memory != nil {
		denials.WithLabelValues(tenant, quota.ResourceGpuMemory).Add(0)
	}
	for class := range l.Devices {
		denials.WithLabelValues(tenant, "devices/"+class).Add(0)
	}
}

// DeleteTenantSeries removes a deleted tenant's series: they would
// otherwise be exported for ever.
func DeleteTenantSeries(tenant string) {
	for _, v := range []*prometheus.CounterVec{admissions, denials, alternativesDropped} {
		v.DeletePartialMatch(prometheus.Labels{"tenant": tenant})
	}
}
