package controller

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller/admission"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller/webhook"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller/webhookcert"
	"github.com/gpuaas/gpu-dra-driver/pkg/quota"
)

// Metrics are registered once per process on controller-runtime's registry
// (served on the manager's metrics endpoint), so a controller restarted in
// the same process (tests) keeps counting. Webhook latency is
// controller-runtime's controller_runtime_webhook_latency_seconds (by
// path, buckets up to 10 s, past the webhook timeout); a histogram of our
// own duplicated it with buckets that ended at 1 s.
var (
	// Each quantity is a metric of its own, so that sum() and rate() over
	// one never mix used, reserved and limit (one gauge with a "kind" label
	// did).
	tenantUnitsUsed     = tenantGauge("gpuaas_tenant_gpu_units_used", "GPU units a tenant's allocated claims hold.")
	tenantUnitsReserved = tenantGauge("gpuaas_tenant_gpu_units_reserved", "GPU units of a tenant's admitted claims not allocated yet (charged at their worst case).")
	tenantUnitsBorrowed = tenantGauge("gpuaas_tenant_gpu_units_borrowed", "GPU units a tenant holds beyond its own limit, lent by its cohort.")
	tenantUnitsLimit    = tenantGauge("gpuaas_tenant_gpu_units_limit", "A tenant's GPU unit limit (absent when it has none).")
	tenantMemUsed       = tenantGauge("gpuaas_tenant_gpu_memory_used_bytes", "GPU memory a tenant's allocated claims hold.")
	tenantMemReserved   = tenantGauge("gpuaas_tenant_gpu_memory_reserved_bytes", "GPU memory of a tenant's admitted claims not allocated yet.")
	tenantMemBorrowed   = tenantGauge("gpuaas_tenant_gpu_memory_borrowed_bytes", "GPU memory a tenant holds beyond its own limit, lent by its cohort.")
	tenantMemLimit      = tenantGauge("gpuaas_tenant_gpu_memory_limit_bytes", "A tenant's GPU memory limit (absent when it has none).")
	tenantDevUsed       = tenantProfileGauge("gpuaas_tenant_devices_used", "Devices of a profile a tenant's allocated claims hold.")
	tenantDevReserved   = tenantProfileGauge("gpuaas_tenant_devices_reserved", "Devices of a profile a tenant's admitted, unallocated claims may take.")
	tenantDevLimit      = tenantProfileGauge("gpuaas_tenant_devices_limit", "A tenant's device limit per profile.")

	tenantGauges = []*prometheus.GaugeVec{tenantUnitsUsed, tenantUnitsReserved, tenantUnitsBorrowed, tenantUnitsLimit,
		tenantMemUsed, tenantMemReserved, tenantMemBorrowed, tenantMemLimit, tenantDevUsed, tenantDevReserved, tenantDevLimit}

	registerOnce sync.Once
)

func registerMetrics() {
	registerOnce.Do(func() {
		for _, g := range tenantGauges {
			ctrlmetrics.Registry.MustRegister(g)
		}
		ctrlmetrics.Registry.MustRegister(cachedSlicesCollector)
		admission.RegisterMetrics()
		webhook.RegisterMetrics()
		webhookcert.RegisterMetrics()
	})
}

func tenantGauge(name, help string) *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, []string{"tenant"})
}

func tenantProfileGauge(name, help string) *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, []string{"tenant", "profile"})
}

// setTenantMetrics exports a tenant's usage and limits. Series that went
// (a limit removed, a profile no longer used) are deleted by their exact
// labels: DeletePartialMatch scans every series of a gauge, and running it
// for each status update made the metrics 16% of the controller's CPU at
// 1,000 tenants.
func setTenantMetrics(q *gpuaas.TenantQuota, r admission.TenantReport, borrowed quota.Charge) {
	name := q.Name
	tenantUnitsUsed.WithLabelValues(name).Set(r.Usage.Used.Units.Float64())
	tenantUnitsReserved.WithLabelValues(name).Set(r.Usage.Reserved.Units.Float64())
	tenantUnitsBorrowed.WithLabelValues(name).Set(borrowed.Units.Float64())
	tenantMemUsed.WithLabelValues(name).Set(float64(r.Usage.Used.Memory))
	tenantMemReserved.WithLabelValues(name).Set(float64(r.Usage.Reserved.Memory))
	tenantMemBorrowed.WithLabelValues(name).Set(float64(borrowed.Memory))
	if l := r.Tenant.Limits.Units; l != nil {
		tenantUnitsLimit.WithLabelValues(name).Set(l.Float64())
	} else {
		tenantUnitsLimit.DeleteLabelValues(name)
	}
	if l := r.Tenant.Limits.Memory; l != nil {
		tenantMemLimit.WithLabelValues(name).Set(float64(*l))
	} else {
		tenantMemLimit.DeleteLabelValues(name)
	}
	profileSeries.set(tenantDevUsed, name, r.Usage.Used.Devices)
	profileSeries.set(tenantDevReserved, name, r.Usage.Reserved.Devices)
	profileSeries.set(tenantDevLimit, name, r.Tenant.Limits.Devices)
	webhook.StartTenantSeries(name, r.Tenant.Limits)
}

// profileSeries remembers which profiles each tenant has a series of, per
// gauge, so that an update deletes exactly those that went.
var profileSeries = &tenantProfileSeries{series: map[*prometheus.GaugeVec]map[string][]string{}}

type tenantProfileSeries struct {
	mu     sync.Mutex
	series map[*prometheus.GaugeVec]map[string][]string // gauge -> tenant -> profiles
}

func (s *tenantProfileSeries) set(g *prometheus.GaugeVec, tenant string, values map[string]int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.series[g] == nil {
		s.series[g] = map[string][]string{}
	}
	for _, profile := range s.series[g][tenant] {
		if _, ok := values[profile]; !ok {
			g.DeleteLabelValues(tenant, profile)
		}
	}
	profiles := make([]string, 0, len(values))
	for profile, n := range values {
		g.WithLabelValues(tenant, profile).Set(float64(n))
		profiles = append(profiles, profile)
	}
	s.series[g][tenant] = profiles
}

func (s *tenantProfileSeries) forget(tenant string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, byTenant := range s.series {
		delete(byTenant, tenant)
	}
}

// deleteTenantMetrics removes every series of a deleted tenant.
func deleteTenantMetrics(name string) {
	for _, v := range tenantGauges {
		v.DeletePartialMatch(prometheus.Labels{"tenant": name})
	}
	// Counters too: a deleted tenant's series would otherwise be exported
	// for ever (the billing counters, the billing package's, are kept: they
	// are what is billed).
	webhook.DeleteTenantSeries(name)
	profileSeries.forget(name)
}
