package telemetry

import (
	"strconv"

	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
	"github.com/prometheus/client_golang/prometheus"
)

// gpuProblemsMetric is registered with the others (NewMetrics).
func newGPUProblemsMetric() *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: metricsNamespace, Name: "gpu_problems",
		Help: "GPUs enumeration could not read completely at start-up, by index, UUID (empty when NVML could not tell) and reason: gpu-lost or unreadable (not published), unknown-attribute (published with brand or architecture Unknown).",
	}, []string{"index", "gpu", "reason"})
}

func (m *Metrics) SetGPUProblems(problems []nvdev.Problem) {
	if m == nil {
		return
	}
	m.GPUProblems.Reset()
	for _, pr := range problems {
		m.GPUProblems.WithLabelValues(strconv.Itoa(pr.Index), pr.UUID, pr.Reason()).Set(1)
	}
}
