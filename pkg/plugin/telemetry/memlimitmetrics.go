package telemetry

import "github.com/prometheus/client_golang/prometheus"

// newMemoryLimits is the gauge that says whether the driver enforces the
// memory of this node's time-slice replicas and memory shares: one
// series, 1 with cause "" where it does, 0 with the cause where it does
// not (cdi.Cause*: driver before r615, cgroups not v2, hooks disabled, no
// driver files).
func newMemoryLimits() *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: metricsNamespace, Name: "memory_limits_enforced",
		Help: "1 when the driver holds each container of a time-slice replica or memory share to the device's memory (driver r615+, cgroup v2, NVIDIA's hooks on); 0 with the cause when not, and such containers can use the whole GPU's memory.",
	}, []string{"cause"})
}

// SetMemoryLimits records whether the node enforces memory limits, and
// why not.
func (m *Metrics) SetMemoryLimits(enforced bool, cause string) {
	if m == nil {
		return
	}
	m.MemoryLimits.Reset()
	v := 0.0
	if enforced {
		v = 1
	}
	m.MemoryLimits.WithLabelValues(cause).Set(v)
}
