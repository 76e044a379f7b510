package controller

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/quota"
)

// Metrics are registered once per process on controller-runtime's registry
// (served on the manager's metrics endpoint), so a controller restarted in
// the same process (tests) keeps counting. Webhook latency is
// controller-runtime's controller_runtime_webhook_latency_seconds (by
// path, buckets up to 10 s, past the webhook timeout); a histogram of our
// own duplicated it with buckets that ended at 1 s.
var (
	tenantUnits = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "gpuaas_tenant_gpu_units",
		Help: "GPU units of a tenant: used (allocated), reserved (admitted, not allocated), borrowed, limit.",
	}, []string{"tenant", "kind"})
	tenantMemory = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "gpuaas_tenant_gpu_memory_bytes",
		Help: "GPU memory of a tenant: used, reserved, borrowed, limit.",
	}, []string{"tenant", "kind"})
	tenantDevices = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "gpuaas_tenant_devices",
		Help: "Devices of a tenant per profile: used, reserved, limit.",
	}, []string{"tenant", "profile", "kind"})
	unitSeconds = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gpuaas_tenant_gpu_unit_seconds_total",
		Help: "GPU units held by allocated claims, integrated over time: the billing counter.",
	}, []string{"tenant"})
	admissions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gpuaas_claim_admissions_total",
		Help: "ResourceClaims the quota webhook decided on, by tenant and result (admitted, denied).",
	}, []string{"tenant", "result"})
	denials = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gpuaas_claim_denials_total",
		Help: "ResourceClaims denied, by tenant and the first resource exceeded.",
	}, []string{"tenant", "resource"})
	profileDevices = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "gpuaas_profile_devices",
		Help: "Devices of a GpuProfile: matching, allocated, free.",
	}, []string{"profile", "state"})

	registerOnce sync.Once
)

func registerMetrics() {
	registerOnce.Do(func() {
		ctrlmetrics.Registry.MustRegister(tenantUnits, tenantMemory, tenantDevices, unitSeconds,
			admissions, denials, profileDevices)
	})
}

func recordAdmission(tenant string, adm Admission) {
	if tenant == "" {
		tenant = "none"
	}
	if adm.Allowed {
		admissions.WithLabelValues(tenant, "admitted").Inc()
		return
	}
	admissions.WithLabelValues(tenant, "denied").Inc()
	denials.WithLabelValues(tenant, adm.Resource).Inc()
}

// setTenantMetrics exports a tenant's usage and limits.
func setTenantMetrics(q *gpuaas.TenantQuota, r TenantReport, borrowed quota.Charge) {
	name := q.Name
	tenantUnits.WithLabelValues(name, "used").Set(r.Usage.Used.Units.Float64())
	tenantUnits.WithLabelValues(name, "reserved").Set(r.Usage.Reserved.Units.Float64())
	tenantUnits.WithLabelValues(name, "borrowed").Set(borrowed.Units.Float64())
	tenantMemory.WithLabelValues(name, "used").Set(float64(r.Usage.Used.Memory))
	tenantMemory.WithLabelValues(name, "reserved").Set(float64(r.Usage.Reserved.Memory))
	tenantMemory.WithLabelValues(name, "borrowed").Set(float64(borrowed.Memory))
	if l := r.Tenant.Limits.Units; l != nil {
		tenantUnits.WithLabelValues(name, "limit").Set(l.Float64())
	}
	if l := r.Tenant.Limits.Memory; l != nil {
		tenantMemory.WithLabelValues(name, "limit").Set(float64(*l))
	}
	tenantDevices.DeletePartialMatch(prometheus.Labels{"tenant": name})
	for profile, n := range r.Usage.Used.Devices {
		tenantDevices.WithLabelValues(name, profile, "used").Set(float64(n))
	}
	for profile, n := range r.Usage.Reserved.Devices {
		tenantDevices.WithLabelValues(name, profile, "reserved").Set(float64(n))
	}
	for profile, n := range r.Tenant.Limits.Devices {
		tenantDevices.WithLabelValues(name, profile, "limit").Set(float64(n))
	}
}

func deleteTenantMetrics(name string) {
	for _, v := range []*prometheus.GaugeVec{tenantUnits, tenantMemory, tenantDevices} {
		v.DeletePartialMatch(prometheus.Labels{"tenant": name})
	}
}

func setProfileMetrics(name string, r ProfileReport) {
	profileDevices.WithLabelValues(name, "matching").Set(float64(r.Matching))
	profileDevices.WithLabelValues(name, "allocated").Set(float64(r.Allocated))
	profileDevices.WithLabelValues(name, "free").Set(float64(r.Matching - r.Allocated))
}

func deleteProfileMetrics(name string) {
	profileDevices.DeletePartialMatch(prometheus.Labels{"profile": name})
}

// billing integrates each tenant's allocated GPU units over time into the
// gpu-unit-seconds counter: units are constant between two observations
// (every change of a tenant's claims triggers one, and the resync bounds
// the gap).
type billing struct {
	mu   sync.Mutex
	last map[string]billingPoint
}

type billingPoint struct {
	units quota.Units
	at    time.Time
}

func newBilling() *billing { return &billing{last: map[string]billingPoint{}} }

func (b *billing) observe(tenant string, units quota.Units, now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if p, ok := b.last[tenant]; ok && now.After(p.at) {
		unitSeconds.WithLabelValues(tenant).Add(p.units.Float64() * now.Sub(p.at).Seconds())
	}
	b.last[tenant] = billingPoint{units: units, at: now}
}

func (b *billing) forget(tenant string, now time.Time) {
	b.observe(tenant, quota.Units{}, now)
	b.mu.Lock()
	delete(b.last, tenant)
	b.mu.Unlock()
}
