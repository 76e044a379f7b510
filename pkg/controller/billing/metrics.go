package billing

import (
	"maps"
	"math/big"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

var (
	unitSecondsDesc = prometheus.NewDesc("gpuaas_tenant_gpu_unit_seconds_total",
		"GPU units held by allocated claims, integrated over time: the billing counter, derived from the TenantUsage records (closed ones and open ones up to now).",
		[]string{"tenant"}, nil)
	usageDesc = prometheus.NewDesc("gpuaas_tenant_usage_unit_seconds_total",
		"GPU-unit-seconds per tenant, profile (or shape) and GPU model, from the TenantUsage records.",
		[]string{"tenant", "profile", "gpu_model"}, nil)
	costDesc = prometheus.NewDesc("gpuaas_tenant_cost_total",
		"Cost per tenant, profile (or shape) and GPU model at the prices that applied, from the TenantUsage records.",
		[]string{"tenant", "profile", "gpu_model", "currency"}, nil)

	idleUnitSecondsDesc = prometheus.NewDesc("gpuaas_tenant_idle_unit_seconds_total",
		"GPU-unit-seconds per tenant, profile (or shape) and GPU model held on devices whose plugin reported them Idle (held, billed, unused), from the TenantUsage records up to their last observation.",
		[]string{"tenant", "profile", "gpu_model"}, nil)
	retiredDesc = prometheus.NewDesc("gpuaas_billing_usages_deleted_total",
		"TenantUsages the leader deleted past --billing-retention-months, per tenant, since this process started (their usage stays in the counters above).",
		[]string{"tenant"}, nil)

	budgetAmountDesc = prometheus.NewDesc("gpuaas_tenant_budget_amount",
		"The TenantQuota's budget per billing period (a UTC month), in the billing currency.",
		[]string{"tenant", "currency"}, nil)
	budgetSpentDesc = prometheus.NewDesc("gpuaas_tenant_budget_spent",
		"What the tenant spent in the current billing period so far, from the TenantUsage records, in the billing currency.",
		[]string{"tenant", "currency"}, nil)
	budgetRatioDesc = prometheus.NewDesc("gpuaas_tenant_budget_spent_ratio",
		"What the tenant spent in the current billing period over its budget (1 is the whole budget).",
		[]string{"tenant"}, nil)
	budgetThresholdDesc = prometheus.NewDesc("gpuaas_tenant_budget_threshold_ratio",
		"Each threshold of the tenant's budget as a ratio of the amount (0.8 for 80 percent), for alerts that compare the spent ratio with the tenant's own thresholds.",
		[]string{"tenant", "threshold"}, nil)

	idleUnitsDesc = prometheus.NewDesc("gpuaas_tenant_idle_gpu_units",
		"GPU units the tenant's allocated claims hold on devices whose plugin reports them Idle (held, billed and unused), at the billing recorder's last reconcile.",
		[]string{"tenant"}, nil)
	idleCostDesc = prometheus.NewDesc("gpuaas_tenant_idle_cost_per_hour",
		"What the GPU units the tenant holds idle cost per hour at their prices: integrated over time, the idle cost.",
		[]string{"tenant", "currency"}, nil)

	registerOnce sync.Once
)

// RegisterMetrics registers the counters of r's records, once (the first
// recorder's: the controller has one).
func RegisterMetrics(r *Recorder) {
	registerOnce.Do(func() { ctrlmetrics.Registry.MustRegister(collector{r}) })
}

// collector derives the counters from the records at each scrape: a new
// leader's counters start from the records in the API, so nothing is
// counted twice.
type collector struct{ r *Recorder }

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- unitSecondsDesc
	ch <- usageDesc
	ch <- costDesc
	ch <- idleUnitSecondsDesc
	ch <- retiredDesc
	ch <- budgetAmountDesc
	ch <- budgetSpentDesc
	ch <- budgetRatioDesc
	ch <- budgetThresholdDesc
	ch <- idleUnitsDesc
	ch <- idleCostDesc
}

type costKey struct{ tenant, profile, model string }

func (c collector) Collect(ch chan<- prometheus.Metric) {
	tenants, usage, cost, currency := c.r.Totals()
	for tenant, us := range tenants {
		f, _ := us.Float64()
		ch <- prometheus.MustNewConstMetric(unitSecondsDesc, prometheus.CounterValue, f, tenant)
	}
	for k, us := range usage {
		f, _ := us.Float64()
		ch <- prometheus.MustNewConstMetric(usageDesc, prometheus.CounterValue, f, k.tenant, k.profile, k.model)
		money, _ := cost[k].Float64()
		ch <- prometheus.MustNewConstMetric(costDesc, prometheus.CounterValue, money, k.tenant, k.profile, k.model, currency)
	}
	idle, deleted := c.r.idleTotals()
	for k, us := range idle {
		f, _ := us.Float64()
		ch <- prometheus.MustNewConstMetric(idleUnitSecondsDesc, prometheus.CounterValue, f, k.tenant, k.profile, k.model)
	}
	for tenant, n := range deleted {
		ch <- prometheus.MustNewConstMetric(retiredDesc, prometheus.CounterValue, float64(n), tenant)
	}
	for tenant, b := range c.r.budgetMetrics() {
		amount, _ := b.amount.Float64()
		spent, _ := b.spent.Float64()
		ratio, _ := new(big.Rat).Quo(b.spent, b.amount).Float64()
		ch <- prometheus.MustNewConstMetric(budgetAmountDesc, prometheus.GaugeValue, amount, tenant, currency)
		ch <- prometheus.MustNewConstMetric(budgetSpentDesc, prometheus.GaugeValue, spent, tenant, currency)
		ch <- prometheus.MustNewConstMetric(budgetRatioDesc, prometheus.GaugeValue, ratio, tenant)
		for _, t := range b.thresholds {
			ch <- prometheus.MustNewConstMetric(budgetThresholdDesc, prometheus.GaugeValue, float64(t)/100, tenant, thresholdLabel(t))
		}
	}
	for tenant, h := range c.r.idleNow() {
		units, _ := h.units.Float64()
		cost, _ := h.costPerHour.Float64()
		ch <- prometheus.MustNewConstMetric(idleUnitsDesc, prometheus.GaugeValue, units, tenant)
		ch <- prometheus.MustNewConstMetric(idleCostDesc, prometheus.GaugeValue, cost, tenant, currency)
	}
}

// Totals are the records' unit-seconds per tenant, and unit-seconds and
// cost per tenant, profile (or shape) and GPU model: closed records and
// open ones up to now, over every period this leader knows.
func (r *Recorder) Totals() (perTenant map[string]*big.Rat, usage, cost map[costKey]*big.Rat, currency string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	perTenant, usage, cost = map[string]*big.Rat{}, map[costKey]*big.Rat{}, map[costKey]*big.Rat{}
	if !r.loaded {
		return perTenant, usage, cost, r.Currency
	}
	now := r.now()
	add := func(tenant, profile, shape, model string, us, c *big.Rat) {
		k := keyOf(tenant, profile, shape, model)
		for _, m := range []struct {
			into map[costKey]*big.Rat
			v    *big.Rat
		}{{usage, us}, {cost, c}} {
			if m.into[k] == nil {
				m.into[k] = new(big.Rat)
			}
			m.into[k].Add(m.into[k], m.v)
		}
		if perTenant[tenant] == nil {
			perTenant[tenant] = new(big.Rat)
		}
		perTenant[tenant].Add(perTenant[tenant], us)
	}
	for k, ret := range r.retired {
		add(k.tenant, k.profile, "", k.model, ret.unitSeconds, ret.cost)
	}
	for _, u := range r.usages {
		for _, t := range u.Status.Totals {
			us := ratOf(t.UnitSeconds)
			add(u.Spec.Tenant, t.Profile, t.Shape, t.GpuModel, us, costOf(us, t.Price))
		}
		for _, rec := range u.Status.Open {
			us := unitSecondsBetween(rec.Units, rec.Start.Time, now)
			add(u.Spec.Tenant, rec.Profile, rec.Shape, rec.GpuModel, us, costOf(us, rec.Price))
		}
	}
	return perTenant, usage, cost, r.Currency
}

// keyOf is the metrics' key of a record or total: the shape's name when
// priced by a shape, else the profile's.
func keyOf(tenant, profile, shape, model string) costKey {
	if shape != "" {
		profile = shape
	}
	return costKey{tenant, profile, model}
}

// idleTotals are the records' idle unit-seconds per tenant, profile (or
// shape) and GPU model up to their lastSeen (accounted idle time never
// goes back, so the counter never goes down), and the TenantUsages
// deleted per tenant.
func (r *Recorder) idleTotals() (map[costKey]*big.Rat, map[string]int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	idle := map[costKey]*big.Rat{}
	if !r.loaded {
		return idle, nil
	}
	add := func(k costKey, us *big.Rat) {
		if idle[k] == nil {
			idle[k] = new(big.Rat)
		}
		idle[k].Add(idle[k], us)
	}
	for k, ret := range r.retired {
		add(k, ret.idle)
	}
	for _, u := range r.usages {
		for _, t := range u.Status.Totals {
			add(keyOf(u.Spec.Tenant, t.Profile, t.Shape, t.GpuModel), ratOf(t.IdleUnitSeconds))
		}
		for _, rec := range u.Status.Open {
			add(keyOf(u.Spec.Tenant, rec.Profile, rec.Shape, rec.GpuModel), ratOf(rec.IdleUnitSeconds))
		}
	}
	// Every tenant with records has the deletions' series, at 0 until one
	// is deleted: "none deleted" is a value a dashboard shows.
	deleted := maps.Clone(r.deleted)
	if deleted == nil {
		deleted = map[string]int64{}
	}
	for _, u := range r.usages {
		if _, ok := deleted[u.Spec.Tenant]; !ok {
			deleted[u.Spec.Tenant] = 0
		}
	}
	return idle, deleted
}
