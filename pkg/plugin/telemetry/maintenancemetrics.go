package telemetry

import "github.com/prometheus/client_golang/prometheus"

func newDriverInfo() *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: metricsNamespace, Name: "driver_info",
		Help: "1, labelled with the NVIDIA driver version the plugin's NVML session and the CDI specs it writes use (after a driver upgrade: the new one, once the plugin reopened NVML).",
	}, []string{"version"})
}

func newGPUsReleased() prometheus.Gauge {
	return prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: metricsNamespace, Name: "gpus_released",
		Help: "1 while the plugin has released the GPUs for maintenance (a GPU reset or a driver upgrade: NVML shut down, devices tainted, new claims refused), else 0.",
	})
}

// SetMaintenance records the driver in use and whether the GPUs are
// released.
func (m *Metrics) SetMaintenance(version string, released bool) {
	if m == nil {
		return
	}
	m.driverInfo.Reset()
	m.driverInfo.WithLabelValues(version).Set(1)
	v := 0.0
	if released {
		v = 1
	}
	m.gpusReleased.Set(v)
}
