package plugin

import (
	"context"
	"slices"
	"sync"

	"k8s.io/klog/v2"

	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/mig"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/device"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/inventory"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/telemetry"
)

// deferredModes are the busy GPUs whose configured mode waits for their
// last claim (device.PinModes), and what applying it needs.
type deferredModes struct {
	// mu guards pending. It is taken before the Driver's mu, and alone
	// when nothing is pending: every unprepare asks, and the Driver's mu
	// is held for as long as the start's first publish waits for its
	// informer (a second), past which the kubelet's call was cut off.
	mu      sync.Mutex
	nvml    nvdev.Interface
	config  *configapi.NodeConfig // the node configuration, unpinned
	pending []device.PinnedMode
	// memoryLimits: the node's CDI specs carry the driver's memory limits
	// (withMemoryLimits), which new devices publish as at start.
	memoryLimits bool
}

// applyDeferredModesHeld applies the deferred modes under the maintenance
// hold (they are discovered through NVML), taken before the Driver's lock
// as a claim's is. While a release waits they wait for a later unprepare.
func (d *Driver) applyDeferredModesHeld(ctx context.Context) {
	release, err := d.maint.Hold(ctx)
	if err != nil {
		klog.FromContext(ctx).V(4).Info("Deferred mode changes wait for a later unprepare", "reason", err.Error())
		return
	}
	defer release()
	d.applyDeferredModes(ctx)
}

// applyDeferredModes gives each pinned GPU that no prepared claim holds
// any more its configured mode: its devices discovered anew, handed to
// the State in place of the old ones and published, the metric and a
// Node event updated. A GPU still held waits for its next unprepare.
// Reserve refuses a device of a GPU another claim holds in another mode,
// so a claim prepared on the old name meanwhile is not given the GPU
// twice; it is reported as stranded at its next prepare.
func (d *Driver) applyDeferredModes(ctx context.Context) {
	if d.deferred == nil {
		return
	}
	d.deferred.mu.Lock()
	defer d.deferred.mu.Unlock()
	if len(d.deferred.pending) == 0 {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.store == nil {
		return
	}
	logger := klog.FromContext(ctx)
	records, _, err := d.store.List()
	if err != nil {
		logger.Error(err, "Reading the prepared claims for the GPUs whose mode change waits; trying at the next unprepare")
		return
	}
	held := map[string]bool{}
	for _, rec := range records {
		for _, dev := range rec.Devices {
			if !dev.AdminAccess {
				held[dev.GPUUUID] = true
			}
		}
	}
	gpus := d.deferred.nvml.GPUs()
	cfg, stillPinned := device.PinModes(logger.V(4), d.deferred.config, gpus, records)
	if len(stillPinned) == len(d.deferred.pending) {
		return
	}
	discovered := inventory.Discover(logger, d.deferred.nvml, cfg)
	var applied []device.PinnedMode
	for _, p := range d.deferred.pending {
		i := slices.IndexFunc(gpus, func(g nvdev.GPU) bool { return g.UUID == p.UUID })
		if held[p.UUID] || i < 0 {
			continue
		}
		fresh := discovered.GPUPart(p.UUID, mig.CounterSetName(gpus[i].Index)).WithMemoryLimits(d.deferred.memoryLimits)
		d.inv = d.inv.WithGPU(gpus[i], fresh)
		d.state.ReplaceGPUDevices(p.UUID, slices.Clone(fresh.Devices))
		applied = append(applied, p)
		logger.Info("GPU idle: its configured mode applies now", "gpu", p.UUID, "index", p.Index,
			"mode", modeOrWhole(p.Configured), "devices", inventory.NamesOf(fresh.Devices))
		d.events.Normal(telemetry.ReasonModeChangeApplied, "PublishResources",
			"GPU %d (%s) is idle: the node configuration's mode %q applies now", p.Index, p.UUID, modeOrWhole(p.Configured))
	}
	if len(applied) == 0 {
		return
	}
	d.deferred.pending = slices.DeleteFunc(d.deferred.pending, func(p device.PinnedMode) bool { return slices.Contains(applied, p) })
	d.metrics.SetModeChangesDeferred(device.ConfiguredModes(d.deferred.config, gpus), d.deferred.pending)
	if d.pub == nil {
		return
	}
	if err := d.publishLocked(ctx); err != nil {
		logger.Error(err, "Publishing the devices of GPUs whose configured mode applies now")
	}
}
