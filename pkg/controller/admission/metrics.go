package admission

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

// The books' metrics, registered once per process on controller-runtime's
// registry (a controller restarted in the same process, in tests, keeps
// counting).
var (
	reclaimedClaims = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gpuaas_quota_reclaimed_claims_total",
		Help: "Unallocated ResourceClaims of a borrowing tenant deleted to give a cohort lender its own quota back (reclaim.go), by the borrowing tenant; counted once gone, not while finalizers hold them.",
	}, []string{"tenant"})
	// A book that cannot be read or written fails its admissions closed,
	// which the webhook's error counter shows only as a refused claim.
	ledgerErrors = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "gpuaas_quota_ledger_errors_total",
		Help: "Reads and writes of a quota book (the reservations every replica sees) that failed, other than losing a race to another replica; each fails its admissions closed.",
	})
	// Issue 36 route 2: claims a tenant kept past the Kueue workload they
	// were admitted for.
	overruledClaimsEnded = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "gpuaas_quota_kueue_overruled_claims_ended_total",
		Help: "ResourceClaims admitted past their TenantQuota for a Kueue workload, deleted because the workload ended and the claim's pod was gone (overrulesweep.go); the claim's event KueueWorkloadEnded names it.",
	})

	registerOnce sync.Once
)

// RegisterMetrics registers the books' metrics, once per process.
func RegisterMetrics() {
	registerOnce.Do(func() { ctrlmetrics.Registry.MustRegister(reclaimedClaims, ledgerErrors, overruledClaimsEnded) })
}
