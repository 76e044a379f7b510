package device

import (
	"cmp"
	"slices"
	"strconv"
	"strings"

	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/checkpoint"
	"github.com/gpuaas/gpu-dra-driver/pkg/timeslice"
	"k8s.io/klog/v2"
)

// Recorded names of the sharing modes (see Kind.modeName).
const (
	modeTimeSlicing = "timeSlicing"
	modeShared      = "shared"
)

// PinnedMode is a busy GPU's mode, kept against the node configuration's.
type PinnedMode struct {
	UUID  string
	Index int
	// Mode is the mode kept and Configured the configuration's, as
	// Kind.ModeName names them ("" whole).
	Mode, Configured string
}

// PinModes refuses mode changes of busy GPUs: a GPU with prepared claims
// keeps the mode it had when they were prepared, whatever the node
// configuration now says, so its claims can still be unprepared and its
// devices are not handed out twice under new names. The change applies
// when the GPU is idle (the plugin asks again after each unprepare, and at
// its next start); until then it is logged as an error, and returned (by
// GPU index) for the Node event and the metric.
func PinModes(logger klog.Logger, cfg *configapi.NodeConfig, gpus []nvdev.GPU, records []*checkpoint.Claim) (*configapi.NodeConfig, []PinnedMode) {
	index := map[string]int{}
	for _, g := range gpus {
		index[g.UUID] = g.Index
	}
	pinned := map[string]string{}
	for _, rec := range records {
		for _, d := range rec.Devices {
			if !d.AdminAccess {
				pinned[d.GPUUUID] = d.GPUMode
			}
		}
	}
	var pins []configapi.GpuModeSelector
	var kept []PinnedMode
	for uuid, mode := range pinned {
		idx, ok := index[uuid]
		want := configuredMode(cfg.ModeFor(idx, uuid))
		if !ok || want == mode {
			continue
		}
		logger.Error(nil, "Refusing to change the mode of a GPU with prepared claims; it keeps its mode until idle",
			"gpu", uuid, "mode", mode, "configuredMode", want)
		pins = append(pins, configapi.GpuModeSelector{UUIDs: []string{uuid}, GpuMode: recordedMode(mode, cfg.ModeFor(idx, uuid))})
		kept = append(kept, PinnedMode{UUID: uuid, Index: idx, Mode: mode, Configured: want})
	}
	if len(pins) == 0 {
		return cfg, nil
	}
	slices.SortFunc(kept, func(a, b PinnedMode) int { return cmp.Compare(a.Index, b.Index) })
	out := cfg.DeepCopyObject().(*configapi.NodeConfig)
	out.GPUs = append(pins, out.GPUs...)
	return out, kept
}

// ConfiguredModes is each GPU's mode in the node configuration (by UUID),
// named as PinnedMode.Configured names it ("" whole).
func ConfiguredModes(cfg *configapi.NodeConfig, gpus []nvdev.GPU) map[string]string {
	out := make(map[string]string, len(gpus))
	for _, g := range gpus {
		out[g.UUID] = configuredMode(cfg.ModeFor(g.Index, g.UUID))
	}
	return out
}

// configuredMode names a configured mode as modeName records it.
func configuredMode(m configapi.GpuMode) string {
	switch {
	case m.TimeSlicing != nil:
		return ReplicaOf(*m.TimeSlicing).ModeName()
	case m.Shared != nil:
		return SharedGPU(*m.Shared).ModeName()
	}
	return string(m.MIG)
}

// settingsSuffix records a shared GPU's settings in its mode name, so a
// busy GPU keeps them too: "/MPS", "/<interval>", or nothing for the
// default (time-slicing, Default interval; what records before the
// settings were the GPU's say).
func settingsSuffix(s timeslice.Settings) string {
	switch {
	case s.Strategy == configapi.MPSStrategy:
		return "/" + string(configapi.MPSStrategy)
	case s.Interval.OrDefault() != configapi.DefaultTimeSlice:
		return "/" + string(s.Interval)
	}
	return ""
}

// parseSettingsSuffix undoes settingsSuffix.
func parseSettingsSuffix(suffix string) (configapi.SharingStrategy, configapi.TimeSliceInterval) {
	if suffix == string(configapi.MPSStrategy) {
		return configapi.MPSStrategy, ""
	}
	return "", configapi.TimeSliceInterval(suffix)
}

// recordedMode turns a recorded mode name back into a mode. A shared GPU
// keeps the configured memory policy if it is still shared (only its
// kind is pinned); otherwise the default policy.
func recordedMode(name string, configured configapi.GpuMode) configapi.GpuMode {
	if rest, ok := strings.CutPrefix(name, modeTimeSlicing+"/"); ok {
		n, suffix, _ := strings.Cut(rest, "/")
		replicas, _ := strconv.Atoi(n)
		strategy, interval := parseSettingsSuffix(suffix)
		return configapi.GpuMode{TimeSlicing: &configapi.TimeSlicingMode{Replicas: max(replicas, 1), Strategy: strategy, Interval: interval}}
	}
	if kind, suffix, _ := strings.Cut(name, "/"); kind == modeShared {
		shared := *cmp.Or(configured.Shared, &configapi.SharedMode{})
		shared.Strategy, _ = parseSettingsSuffix(suffix)
		return configapi.GpuMode{Shared: &shared}
	}
	mode := configapi.MigStrategy(name)
	return configapi.GpuMode{MIG: mode, MigModeEnabledByAdmin: mode != ""}
}
