package health

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the monitor's Prometheus metrics; nil records nothing.
type Metrics struct {
	xids   *prometheus.CounterVec
	faults *prometheus.GaugeVec
}

// NewMetrics creates the metrics and registers them with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		xids: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "gpuaas_dra_plugin", Name: "gpu_xid_total",
			Help: "XIDs reported by NVML, by GPU UUID, XID and class (application, transient, reset-required).",
		}, []string{"gpu", "xid", "class"}),
		faults: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "gpuaas_dra_plugin", Name: "device_faults",
			Help: "Current device faults (each a taint on the affected devices), by GPU UUID and kind.",
		}, []string{"gpu", "kind"}),
	}
	reg.MustRegister(m.xids, m.faults)
	return m
}

func (m *Metrics) xid(gpu string, xid uint64, class XIDClass) {
	if m == nil {
		return
	}
	m.xids.WithLabelValues(gpu, fmt.Sprint(xid), class.String()).Inc()
}

func (m *Metrics) setFaults(faults []Fault) {
	if m == nil {
		return
	}
	m.faults.Reset()
	for _, f := range faults {
		m.faults.WithLabelValues(f.GPU, f.Kind).Inc()
	}
}
