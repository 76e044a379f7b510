package plugin

import (
	"context"
	"slices"

	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/mig"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/checkpoint"
	"k8s.io/klog/v2"
)

// pinModes refuses mode changes of busy GPUs: a GPU with prepared claims
// keeps the mode it had when they were prepared, whatever the node
// configuration now says, so its claims can still be unprepared. The change
// applies at the first restart after the GPU is idle; until then it is
// logged as an error.
func pinModes(logger klog.Logger, cfg *configapi.NodeConfig, gpus []nvdev.GPU, records []*checkpoint.Claim) *configapi.NodeConfig {
	index := map[string]int{}
	for _, g := range gpus {
		index[g.UUID] = g.Index
	}
	pinned := map[string]configapi.MigStrategy{}
	for _, rec := range records {
		for _, d := range rec.Devices {
			if d.AdminAccess {
				continue
			}
			pinned[d.GPUUUID] = configapi.MigStrategy(d.GPUMode)
		}
	}
	var pins []configapi.GpuModeSelector
	for uuid, mode := range pinned {
		idx, ok := index[uuid]
		want := cfg.ModeFor(idx, uuid).MIG
		if !ok || want == mode {
			continue
		}
		logger.Error(nil, "Refusing to change the mode of a GPU with prepared claims; it keeps its mode until idle",
			"gpu", uuid, "mode", mode, "configuredMode", want)
		pins = append(pins, configapi.GpuModeSelector{UUIDs: []string{uuid},
			GpuMode: configapi.GpuMode{MIG: mode, MigModeEnabledByAdmin: mode != ""}})
	}
	if len(pins) == 0 {
		return cfg
	}
	out := cfg.DeepCopyObject().(*configapi.NodeConfig)
	out.GPUs = append(pins, out.GPUs...)
	return out
}

// reportUnknownMIG logs MIG devices on dynamic-MIG GPUs that no prepared
// claim accounts for: made by hand, or left by a crash the checkpoint did
// not see. They are reported, not destroyed: they might be someone's.
func (s *State) reportUnknownMIG(ctx context.Context) {
	known := map[string]bool{}
	for _, rec := range s.index.list() {
		for _, d := range rec.Devices {
			if d.CreatedMIG != nil {
				known[d.CreatedMIG.UUID] = true
			}
		}
	}
	gpus := map[string]bool{}
	for _, d := range s.devices {
		if d.Mode == configapi.MigDynamic {
			gpus[d.GPU.UUID] = true
		}
	}
	for uuid := range gpus {
		dev, err := s.nvml.DeviceByUUID(uuid)
		if err != nil {
			continue
		}
		insts, err := mig.List(dev)
		if err != nil {
			klog.FromContext(ctx).Error(err, "Listing MIG devices", "gpu", uuid)
			continue
		}
		for _, inst := range slices.DeleteFunc(insts, func(i mig.Instance) bool { return known[i.UUID] }) {
			klog.FromContext(ctx).Error(nil, "MIG device not created for any prepared claim; leaving it alone",
				"gpu", uuid, "mig", inst.UUID, "profile", inst.Profile, "placement", inst.Placement)
		}
	}
}
