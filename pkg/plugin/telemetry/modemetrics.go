package telemetry

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/device"
)

// newModeChangesDeferred is the gauge of the GPUs whose configured mode is
// not applied because claims hold them in their old one: 1 for those, 0
// for every other GPU, so that "nothing deferred" is a value a dashboard
// shows, not an absent series.
func newModeChangesDeferred() *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: metricsNamespace, Name: "gpu_mode_change_deferred",
		Help: "1 per GPU whose mode in the node configuration (configuredMode) is not applied because prepared claims hold it in its old mode (it applies when the GPU's last claim is unprepared); 0 for every GPU whose configured mode applies.",
	}, []string{"gpu", "configuredMode"})
}

// SetModeChangesDeferred records the busy GPUs that keep their mode, and
// every other GPU of configured (UUID to configured mode, as
// device.ConfiguredModes names them) at 0.
func (m *Metrics) SetModeChangesDeferred(configured map[string]string, pinned []device.PinnedMode) {
	if m == nil {
		return
	}
	m.ModeChangesDeferred.Reset()
	for uuid, mode := range configured {
		m.ModeChangesDeferred.WithLabelValues(uuid, modeOrWhole(mode)).Set(0)
	}
	for _, p := range pinned {
		m.ModeChangesDeferred.WithLabelValues(p.UUID, modeOrWhole(p.Configured)).Set(1)
	}
}

func modeOrWhole(m string) string {
	if m == "" {
		return "whole"
	}
	return m
}
