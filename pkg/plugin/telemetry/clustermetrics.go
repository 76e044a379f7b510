package telemetry

import (
	"slices"

	"github.com/gpuaas/gpu-dra-driver/pkg/sliceprobe"
	"github.com/prometheus/client_golang/prometheus"
)

func newClusterGaps() *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: metricsNamespace, Name: "cluster_feature_missing",
		Help: "1 for each feature (0 for the others) the API server drops or refuses in the slices the plugin would publish (found by dry-run creates at start and after the API server changes), by feature and the feature gate that brings it; the plugin publishes less instead (docs/install.md).",
	}, []string{"feature", "gate"})
}

// SetClusterGaps records what the cluster lacks: 1 for each of gaps, 0 for
// every other gap a cluster may have.
func (m *Metrics) SetClusterGaps(gaps []sliceprobe.Gap) {
	if m == nil {
		return
	}
	for _, g := range sliceprobe.AllGaps() {
		v := 0.0
		if slices.Contains(gaps, g) {
			v = 1
		}
		m.clusterGaps.WithLabelValues(g.Feature, g.Gate).Set(v)
	}
}
