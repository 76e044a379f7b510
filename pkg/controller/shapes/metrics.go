package shapes

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

// shapePlaceable is what a GpuShape's status.placeable says.
var shapePlaceable = prometheus.NewGaugeVec(prometheus.GaugeOpts{
	Name: "gpuaas_shape_placeable",
	Help: "Instances of a GpuShape that could be placed now: disjoint same-node sets of healthy, unallocated devices, alignment respected.",
}, []string{"shape"})

var registerOnce sync.Once

// RegisterMetrics adds the shape metrics to controller-runtime's registry
// once per process.
func RegisterMetrics() {
	registerOnce.Do(func() { ctrlmetrics.Registry.MustRegister(shapePlaceable) })
}
