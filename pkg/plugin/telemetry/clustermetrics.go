package telemetry

import (
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/sliceprobe"
	"github.com/prometheus/client_golang/prometheus"
)

func newClusterGaps() *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: metricsNamespace, Name: "cluster_feature_missing",
		Help: "1 for each feature the API server drops or refuses in the slices the plugin would publish (found by dry-run creates at start and after the API server changes), by feature and the feature gate that brings it; the plugin publishes less instead (docs/install.md).",
	}, []string{"feature", "gate"})
}

// SetClusterGaps records what the cluster lacks; none: no series.
func (m *Metrics) SetClusterGaps(gaps []sliceprobe.Gap) {
	if m == nil {
		return
	}
	m.clusterGaps.Reset()
	for _, g := range gaps {
		m.clusterGaps.WithLabelValues(g.Feature, g.Gate).Set(1)
	}
}
