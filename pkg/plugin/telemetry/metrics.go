// Package telemetry is what the plugin tells an operator about its node:
// the Prometheus metrics and the Events recorded on the Node.
package telemetry

import (
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/device"
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the plugin's Prometheus metrics. A nil *Metrics is valid and
// records nothing, which keeps tests and benchmarks free of registries.
type Metrics struct {
	Operations       *prometheus.CounterVec
	duration         *prometheus.HistogramVec
	preparedClaims   prometheus.Gauge
	preparedDevices  prometheus.Gauge
	Damaged          prometheus.Counter
	StaleCleaned     prometheus.Counter
	PublishedDevices *prometheus.GaugeVec
	UnownedMIG       *prometheus.GaugeVec
	WithdrawnMIG     prometheus.Gauge
	GPUProblems      *prometheus.GaugeVec
	DeviceInfo       *prometheus.GaugeVec
	driverInfo       *prometheus.GaugeVec
	gpusReleased     prometheus.Gauge
	DpWithheld       prometheus.Gauge
	DpCheckFailed    prometheus.Gauge
	clusterGaps      *prometheus.GaugeVec
	MemoryLimits     *prometheus.GaugeVec
	// ModeChangesDeferred: SetModeChangesDeferred.
	ModeChangesDeferred *prometheus.GaugeVec
}

const metricsNamespace = "gpuaas_dra_plugin"

// NewMetrics creates the metrics and registers them with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Operations: prometheus.NewCounterVec(prometheus.CounterOpts{
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
		Damaged: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: metricsNamespace, Name: "checkpoint_damaged_total",
			Help: "Checkpoint records found damaged at start-up (moved aside and rebuilt from the API).",
		}),
		StaleCleaned: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: metricsNamespace, Name: "stale_claims_cleaned_total",
			Help: "Prepared claims cleaned up because the claim no longer exists.",
		}),
		PublishedDevices: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: metricsNamespace, Name: "published_devices", Help: "Devices published in ResourceSlices, by type.",
		}, []string{"type"}),
		UnownedMIG: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: metricsNamespace, Name: "unowned_mig_instances",
			Help: "GPU instances found at start-up on a dynamic-MIG GPU that no claim owns, by GPU UUID: left alone, and their placements not offered.",
		}, []string{"gpu"}),
		WithdrawnMIG: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: metricsNamespace, Name: "dynamic_mig_withdrawn_gpus",
			Help: "Dynamic-MIG GPUs no longer offered because the cluster drops the counters of partitionable devices (feature gate DRAPartitionableDevices off in the API server); 0 when dynamic MIG is offered as configured.",
		}),
		GPUProblems:         newGPUProblemsMetric(),
		DeviceInfo:          newPreparedDeviceInfo(),
		driverInfo:          newDriverInfo(),
		gpusReleased:        newGPUsReleased(),
		clusterGaps:         newClusterGaps(),
		MemoryLimits:        newMemoryLimits(),
		ModeChangesDeferred: newModeChangesDeferred(),
	}
	m.DpWithheld, m.DpCheckFailed = newDevicePluginMetrics()
	// Every series an alert takes increase() of exists from the start, at
	// 0: one that appears at its first increment, already at 1, hides it.
	for _, op := range []string{"prepare", "unprepare"} {
		for _, result := range []string{"success", "error"} {
			m.Operations.WithLabelValues(op, result)
		}
	}
	reg.MustRegister(m.Operations, m.duration, m.preparedClaims, m.preparedDevices,
		m.Damaged, m.StaleCleaned, m.PublishedDevices, m.UnownedMIG, m.WithdrawnMIG, m.GPUProblems, m.DeviceInfo,
		m.driverInfo, m.gpusReleased, m.DpWithheld, m.DpCheckFailed, m.clusterGaps, m.MemoryLimits, m.ModeChangesDeferred)
	return m
}

func (m *Metrics) Observe(op string, seconds float64, err error) {
	if m == nil {
		return
	}
	result := "success"
	if err != nil {
		result = "error"
	}
	m.Operations.WithLabelValues(op, result).Inc()
	m.duration.WithLabelValues(op).Observe(seconds)
}

func (m *Metrics) AddDamaged(n int) {
	if m != nil {
		m.Damaged.Add(float64(n))
	}
}

func (m *Metrics) AddStale(n int) {
	if m != nil {
		m.StaleCleaned.Add(float64(n))
	}
}

func (m *Metrics) SetPublished(devices []device.AllocatableDevice) {
	if m == nil {
		return
	}
	// A type no longer published (dynamic MIG withdrawn) must read 0.
	m.PublishedDevices.Reset()
	counts := map[device.DeviceType]int{}
	for _, d := range devices {
		counts[d.Type()]++
	}
	for t, n := range counts {
		m.PublishedDevices.WithLabelValues(string(t)).Set(float64(n))
	}
}

func (m *Metrics) SetUnownedMIG(gpu string, n int) {
	if m != nil {
		m.UnownedMIG.WithLabelValues(gpu).Set(float64(n))
	}
}

func (m *Metrics) SetDynamicMIGWithdrawn(gpus int) {
	if m != nil {
		m.WithdrawnMIG.Set(float64(gpus))
	}
}
