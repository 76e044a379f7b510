package plugin

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the plugin's Prometheus metrics. A nil *Metrics is valid and
// records nothing, which keeps tests and benchmarks free of registries.
type Metrics struct {
	operations       *prometheus.CounterVec
	duration         *prometheus.HistogramVec
	preparedClaims   prometheus.Gauge
	preparedDevices  prometheus.Gauge
	damaged          prometheus.Counter
	staleCleaned     prometheus.Counter
	publishedDevices *prometheus.GaugeVec
	unownedMIG       *prometheus.GaugeVec
	withdrawnMIG     prometheus.Gauge
	gpuProblems      *prometheus.GaugeVec
	deviceInfo       *prometheus.GaugeVec
	driverInfo       *prometheus.GaugeVec
	gpusReleased     prometheus.Gauge
	dpWithheld       prometheus.Gauge
	dpCheckFailed    prometheus.Gauge
}

const metricsNamespace = "gpuaas_dra_plugin"

// NewMetrics creates the metrics and registers them with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		operations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: metricsNamespace, Name: "claim_operations_total",
			Help: "Prepare and unprepare operations per claim, by result.",
		}, []string{"operation", "result"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: metricsNamespace, Name: "claim_operation_duration_seconds",
			Help:    "Time to prepare or unprepare one claim.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}, []string{"operation"}),
		preparedClaims: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: metricsNamespace, Name: "prepared_claims", Help: "Claims currently prepared on this node.",
		}),
		preparedDevices: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: metricsNamespace, Name: "prepared_devices", Help: "Devices currently prepared on this node.",
		}),
		damaged: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: metricsNamespace, Name: "checkpoint_damaged_total",
			Help: "Checkpoint records found damaged at start-up (moved aside and rebuilt from the API).",
		}),
		staleCleaned: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: metricsNamespace, Name: "stale_claims_cleaned_total",
			Help: "Prepared claims cleaned up because the claim no longer exists.",
		}),
		publishedDevices: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: metricsNamespace, Name: "published_devices", Help: "Devices published in ResourceSlices, by type.",
		}, []string{"type"}),
		unownedMIG: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: metricsNamespace, Name: "unowned_mig_instances",
			Help: "GPU instances found at start-up on a dynamic-MIG GPU that no claim owns, by GPU UUID: left alone, and their placements not offered.",
		}, []string{"gpu"}),
		withdrawnMIG: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: metricsNamespace, Name: "dynamic_mig_withdrawn_gpus",
			Help: "Dynamic-MIG GPUs no longer offered because the cluster drops the counters of partitionable devices (feature gate DRAPartitionableDevices off in the API server); 0 when dynamic MIG is offered as configured.",
		}),
		gpuProblems:  newGPUProblemsMetric(),
		deviceInfo:   newPreparedDeviceInfo(),
		driverInfo:   newDriverInfo(),
		gpusReleased: newGPUsReleased(),
	}
	m.dpWithheld, m.dpCheckFailed = newDevicePluginMetrics()
	// Every series an alert takes increase() of exists from the start, at
	// 0: one that appears at its first increment, already at 1, hides it.
	for _, op := range []string{"prepare", "unprepare"} {
		for _, result := range []string{"success", "error"} {
			m.operations.WithLabelValues(op, result)
		}
	}
	reg.MustRegister(m.operations, m.duration, m.preparedClaims, m.preparedDevices,
		m.damaged, m.staleCleaned, m.publishedDevices, m.unownedMIG, m.withdrawnMIG, m.gpuProblems, m.deviceInfo,
		m.driverInfo, m.gpusReleased, m.dpWithheld, m.dpCheckFailed)
	return m
}

func (m *Metrics) observe(op string, seconds float64, err error) {
	if m == nil {
		return
	}
	result := "success"
	if err != nil {
		result = "error"
	}
	m.operations.WithLabelValues(op, result).Inc()
	m.duration.WithLabelValues(op).Observe(seconds)
}

func (m *Metrics) addDamaged(n int) {
	if m != nil {
		m.damaged.Add(float64(n))
	}
}

func (m *Metrics) addStale(n int) {
	if m != nil {
		m.staleCleaned.Add(float64(n))
	}
}

func (m *Metrics) setPublished(devices []AllocatableDevice) {
	if m == nil {
		return
	}
	// A type no longer published (dynamic MIG withdrawn) must read 0.
	m.publishedDevices.Reset()
	counts := map[DeviceType]int{}
	for _, d := range devices {
		counts[d.Type()]++
	}
	for t, n := range counts {
		m.publishedDevices.WithLabelValues(string(t)).Set(float64(n))
	}
}

func (m *Metrics) setUnownedMIG(gpu string, n int) {
	if m != nil {
		m.unownedMIG.WithLabelValues(gpu).Set(float64(n))
	}
}

func (m *Metrics) setDynamicMIGWithdrawn(gpus int) {
	if m != nil {
		m.withdrawnMIG.Set(float64(gpus))
	}
}
