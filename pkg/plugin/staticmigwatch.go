package plugin

import (
	"context"
	"fmt"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/inventory"
	"slices"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/klog/v2"
)

// DefaultStaticMIGResync is how often the MIG layouts of static-MIG GPUs
// are read again. Static MIG devices are the admin's (mig-parted, the GPU
// Operator's mig-manager), who may make them after the plugin started,
// typically at boot while the plugin already runs: read once, they were
// never published until the plugin restarted. NVML has no event for a MIG
// layout change, so the layouts are polled; a read is a few NVML calls per
// static GPU.
const DefaultStaticMIGResync = 30 * time.Second

// watchStaticMIG re-reads every interval (negative: never) until ctx ends
// every GPU's minor number, and the static-MIG GPUs' layouts, and
// publishes what changed. Minors: a GPU re-bound from outside the plugin
// (mig-manager switching MIG mode, an admin's nvidia-smi) may come back
// with a new one, which CDI specs must name from then on.
func (d *Driver) watchStaticMIG(ctx context.Context, lib nvdev.Interface, cfg *configapi.NodeConfig, interval time.Duration) {
	if interval < 0 {
		return
	}
	if interval == 0 {
		interval = DefaultStaticMIGResync
	}
	all := slices.Clone(lib.GPUs())
	var static []nvdev.GPU
	for _, gpu := range all {
		if cfg.ModeFor(gpu.Index, gpu.UUID).MIG == configapi.MigStatic {
			static = append(static, gpu)
		}
	}
	go func() {
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			d.rereadMinors(ctx, lib, all, static)
			d.refreshStaticMIG(ctx, lib, static)
		}
	}()
}

// rereadMinors reads the minor numbers of the GPUs that are not static
// MIG (refreshStaticMIG reads those with their layouts).
func (d *Driver) rereadMinors(ctx context.Context, lib nvdev.Interface, gpus, static []nvdev.GPU) {
	for i := range gpus {
		if slices.ContainsFunc(static, func(g nvdev.GPU) bool { return g.UUID == gpus[i].UUID }) {
			continue
		}
		if err := d.rereadMinor(ctx, lib, &gpus[i]); err != nil {
			klog.FromContext(ctx).V(2).Info("Minor number not read; trying again at the next resync", "gpu", gpus[i].UUID, "err", err)
		}
	}
}

// refreshStaticMIG reads the layouts of the static-MIG GPUs and, where
// one differs from what is published, publishes the GPU's devices anew: its
// MIG devices, or the whole GPU while its MIG mode is off (as at start).
// It reads their minor numbers too: mig-manager's MIG mode changes may
// re-bind a GPU with a new one, which gpus then hold.
func (d *Driver) refreshStaticMIG(ctx context.Context, lib nvdev.Interface, gpus []nvdev.GPU) {
	logger := klog.FromContext(ctx)
	for i := range gpus {
		if err := d.rereadMinor(ctx, lib, &gpus[i]); err != nil {
			logger.V(2).Info("Minor number not read; trying again at the next resync", "gpu", gpus[i].UUID, "err", err)
			continue
		}
		gpu := gpus[i]
		d.mu.Lock()
		published := d.inv
		d.mu.Unlock()
		fresh, err := published.StaticGPU(lib, gpu)
		if err != nil {
			logger.V(2).Info("Static MIG layout not read; trying again at the next resync", "gpu", gpu.UUID, "err", err)
			continue
		}
		d.mu.Lock()
		inv := d.inv.WithGPU(gpu, fresh)
		if d.withdrawn {
			inv, _, _ = inv.WithoutCounters() // as published since
		}
		if equality.Semantic.DeepEqual(inventory.APIsOf(d.inv.Devices, gpu.UUID), inventory.APIsOf(inv.Devices, gpu.UUID)) {
			d.mu.Unlock()
			continue
		}
		d.inv = inv
		d.state.ReplaceGPUDevices(gpu.UUID, slices.Clone(fresh.Devices))
		logger.Info("Static MIG layout changed; publishing the GPU's devices anew", "gpu", gpu.UUID, "index", gpu.Index,
			"devices", inventory.NamesOf(fresh.Devices))
		err = d.publishLocked(ctx)
		d.mu.Unlock()
		if err != nil {
			logger.Error(err, "Publishing a changed static MIG layout")
		}
	}
}

// rereadMinor reads a GPU's minor number again, on a handle
// asked for again if the cached one is stale, and where it changed (the
// GPU was re-bound) goes through the same path as a re-bind the plugin
// made (rebind.go): the new minor published, CDI specs naming it, the
// handle forgotten and the GPU registered for events again.
func (d *Driver) rereadMinor(ctx context.Context, lib nvdev.Interface, gpu *nvdev.GPU) error {
	minor := gpu.Minor
	renewed, err := nvdev.WithHandle(lib, gpu.UUID, func(dev nvml.Device) error {
		var ret nvml.Return
		minor, ret = dev.GetMinorNumber()
		return nvdev.Returned(ret)
	})
	if err != nil {
		return fmt.Errorf("reading the minor number: %w", err)
	}
	if minor == gpu.Minor {
		if renewed && d.reregister != nil {
			d.reregister() // re-bound with the same minor: only the handle and events went stale
		}
		return nil
	}
	klog.FromContext(ctx).Info("GPU re-bound with a new minor number; its device nodes follow",
		"gpu", gpu.UUID, "index", gpu.Index, "oldMinor", gpu.Minor, "minor", minor)
	gpu.Minor = minor
	d.state.GPURebound(ctx, gpu.UUID, minor)
	return nil
}
