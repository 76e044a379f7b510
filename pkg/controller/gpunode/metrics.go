package gpunode

import (
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/posture"
)

// Posture metrics: one series per GPU (and per node) at 1, labelled with
// its current posture, so `gpuaas_gpu_posture{posture="Unhealthy"} == 1`
// alerts and `sum by (posture) (gpuaas_gpu_posture)` counts the fleet. A
// posture that no longer holds loses its series rather than going to 0,
// so the sums stay exact.
var (
	gpuPostureGauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "gpuaas_gpu_posture",
		Help: "1 for a GPU's current posture (Available, PartiallyAllocated, FullyAllocated, AllocatedWhole, Draining, CleanupBlocked, Unhealthy), by node and GPU index; the reason is in the node's GpuNode status.",
	}, []string{"node", "gpu", "posture"})
	nodePostureGauge = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "gpuaas_node_posture",
		Help: "1 for a node's current GPU posture (a GPU posture, Degraded, Empty or ExclusivelyAllocated), by node.",
	}, []string{"node", "posture"})

	registerPostureOnce sync.Once
)

// registerPostureMetrics adds the posture metrics to controller-runtime's
// registry once per process, like the rest of the controller's metrics.
func registerPostureMetrics() {
	registerPostureOnce.Do(func() {
		ctrlmetrics.Registry.MustRegister(gpuPostureGauge, nodePostureGauge)
	})
}

// gpuSeries is the label values of one gpuaas_gpu_posture series of a node.
type gpuSeries struct{ gpu, posture string }

// postureMetrics remembers what series each node exported, so that a GPU
// whose posture changed, or that is gone, loses its old series without a
// window in which a scrape sees the node with no series at all.
type postureMetrics struct {
	mu    sync.Mutex
	gpus  map[string]map[gpuSeries]bool
	nodes map[string]gpuaas.Posture
}

func newPostureMetrics() *postureMetrics {
	return &postureMetrics{gpus: map[string]map[gpuSeries]bool{}, nodes: map[string]gpuaas.Posture{}}
}

// set exports a node's posture and drops the series that no longer hold.
func (m *postureMetrics) set(np *posture.NodePosture) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := make(map[gpuSeries]bool, len(np.GPUs))
	for _, g := range np.GPUs {
		s := gpuSeries{gpu: strconv.Itoa(g.Index), posture: string(g.Posture)}
		now[s] = true
		gpuPostureGauge.WithLabelValues(np.Node, s.gpu, s.posture).Set(1)
	}
	for s := range m.gpus[np.Node] {
		if !now[s] {
			gpuPostureGauge.DeleteLabelValues(np.Node, s.gpu, s.posture)
		}
	}
	m.gpus[np.Node] = now
	nodePostureGauge.WithLabelValues(np.Node, string(np.Posture)).Set(1)
	if old, ok := m.nodes[np.Node]; ok && old != np.Posture {
		nodePostureGauge.DeleteLabelValues(np.Node, string(old))
	}
	m.nodes[np.Node] = np.Posture
}

// forget drops every series of a node that publishes nothing any more.
func (m *postureMetrics) forget(node string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	gpuPostureGauge.DeletePartialMatch(prometheus.Labels{"node": node})
	nodePostureGauge.DeletePartialMatch(prometheus.Labels{"node": node})
	delete(m.gpus, node)
	delete(m.nodes, node)
}
