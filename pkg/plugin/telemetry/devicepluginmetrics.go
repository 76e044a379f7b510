package telemetry

import "github.com/prometheus/client_golang/prometheus"

// devicePluginMetrics are registered with the others (NewMetrics); both
// exist from the start, at 0, so their alert and panel have data.
func newDevicePluginMetrics() (withheld, checkFailed prometheus.Gauge) {
	return prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: metricsNamespace, Name: "device_plugin_withheld_gpus",
			Help: "GPUs not published because a device plugin hands out NVIDIA GPUs on this node (--device-plugin-coexistence: stand-down withholds all of them, exclude-owned those the device plugin hands out).",
		}), prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: metricsNamespace, Name: "device_plugin_check_failed",
			Help: "1 while the kubelet's PodResources API cannot be read, so whether a device plugin hands out this node's GPUs is unknown.",
		})
}

func (m *Metrics) SetDevicePluginWithheld(n int) {
	if m != nil {
		m.DpWithheld.Set(float64(n))
	}
}

func (m *Metrics) SetDevicePluginCheckFailed(failed bool) {
	if m == nil {
		return
	}
	v := 0.0
	if failed {
		v = 1
	}
	m.DpCheckFailed.Set(v)
}
