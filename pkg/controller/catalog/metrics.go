package catalog

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

// Catalog metrics: per GpuProfile, what its status reports.
var (
	profileMatching  = profileGauge("gpuaas_profile_devices", "Published devices a GpuProfile selects.")
	profileAllocated = profileGauge("gpuaas_profile_devices_allocated", "Devices of a GpuProfile allocated to claims.")
	profileFree      = profileGauge("gpuaas_profile_devices_free", "Devices of a GpuProfile a claim could be given now: not allocated, and not blocked by what shares their GPU (counters of partitions, capacity of shares).")

	profileGauges = []*prometheus.GaugeVec{profileMatching, profileAllocated, profileFree}

	registerOnce sync.Once
)

// RegisterMetrics adds the catalog metrics to controller-runtime's registry
// once per process.
func RegisterMetrics() {
	registerOnce.Do(func() {
		for _, g := range profileGauges {
			ctrlmetrics.Registry.MustRegister(g)
		}
	})
}

func profileGauge(name, help string) *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, []string{"profile"})
}

func setProfileMetrics(name string, r ProfileReport) {
	profileMatching.WithLabelValues(name).Set(float64(r.Matching))
	profileAllocated.WithLabelValues(name).Set(float64(r.Allocated))
	profileFree.WithLabelValues(name).Set(float64(r.Free))
}

func deleteProfileMetrics(name string) {
	for _, v := range profileGauges {
		v.DeletePartialMatch(prometheus.Labels{"profile": name})
	}
}
