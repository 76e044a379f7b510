package plugin

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/mig"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
	resourceapi "k8s.io/api/resource/v1"
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

// watchStaticMIG re-reads the static-MIG GPUs' layouts every interval
// (negative: never) until ctx ends, and publishes what changed.
func (d *Driver) watchStaticMIG(ctx context.Context, lib nvdev.Interface, cfg *configapi.NodeConfig, interval time.Duration) {
	if interval < 0 {
		return
	}
	if interval == 0 {
		interval = DefaultStaticMIGResync
	}
	var static []nvdev.GPU
	for _, gpu := range lib.GPUs() {
		if cfg.ModeFor(gpu.Index, gpu.UUID).MIG == configapi.MigStatic {
			static = append(static, gpu)
		}
	}
	if len(static) == 0 {
		return
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
			d.refreshStaticMIG(ctx, lib, static)
		}
	}()
}

// refreshStaticMIG reads the layouts of the static-MIG GPUs and, where
// one differs from what is published, publishes the GPU's devices anew: its
// MIG devices, or the whole GPU while its MIG mode is off (as at start).
func (d *Driver) refreshStaticMIG(ctx context.Context, lib nvdev.Interface, gpus []nvdev.GPU) {
	logger := klog.FromContext(ctx)
	for _, gpu := range gpus {
		fresh, err := d.staticInventory(lib, gpu)
		if err != nil {
			logger.V(2).Info("Static MIG layout not read; trying again at the next resync", "gpu", gpu.UUID, "err", err)
			continue
		}
		d.mu.Lock()
		inv := d.inv.withGPU(gpu, fresh)
		if d.withdrawn {
			inv, _, _ = inv.withoutCounters() // as published since
		}
		if equality.Semantic.DeepEqual(apisOf(d.inv.Devices, gpu.UUID), apisOf(inv.Devices, gpu.UUID)) {
			d.mu.Unlock()
			continue
		}
		d.inv = inv
		d.state.replaceGPUDevices(gpu.UUID, slices.Clone(fresh.Devices))
		logger.Info("Static MIG layout changed; publishing the GPU's devices anew", "gpu", gpu.UUID, "index", gpu.Index,
			"devices", namesOf(fresh.Devices))
		err = d.publishLocked(ctx)
		d.mu.Unlock()
		if err != nil {
			logger.Error(err, "Publishing a changed static MIG layout")
		}
	}
}

// staticInventory is the inventory of one static-MIG GPU as it is now,
// with its MIG mode read again (mig-manager may have switched it).
func (d *Driver) staticInventory(lib nvdev.Interface, gpu nvdev.GPU) (Inventory, error) {
	dev, err := lib.DeviceByUUID(gpu.UUID)
	if err != nil {
		return Inventory{}, err
	}
	if gpu.MigCapable {
		current, _, ret := dev.GetMigMode()
		if ret != nvml.SUCCESS {
			return Inventory{}, fmt.Errorf("reading MIG mode: %w", ret)
		}
		gpu.MigEnabled = current == nvml.DEVICE_MIG_ENABLE
	}
	d.mu.Lock()
	units := d.inv.units
	d.mu.Unlock()
	fresh := Inventory{ownSlice: map[int]bool{}, layouts: map[string]*mig.Layout{}, units: units}
	if err := fresh.addStatic(lib, gpu); err != nil {
		if gpu.MigEnabled {
			return Inventory{}, err // not offered whole in MIG mode; as Discover
		}
		fresh = Inventory{ownSlice: map[int]bool{}, layouts: map[string]*mig.Layout{}, units: units}
		fresh.addWhole(gpu, lib.System())
	}
	return fresh, nil
}

// withGPU returns inv with the devices and unit counter set of gpu
// replaced by fresh's, at the place the old ones had (the order of devices
// is the allocator's preference).
func (inv Inventory) withGPU(gpu nvdev.GPU, fresh Inventory) Inventory {
	out := inv
	at := slices.IndexFunc(inv.Devices, func(d AllocatableDevice) bool { return d.GPU.UUID == gpu.UUID })
	devices := slices.DeleteFunc(slices.Clone(inv.Devices), func(d AllocatableDevice) bool { return d.GPU.UUID == gpu.UUID })
	if at < 0 {
		at = len(devices)
	}
	out.Devices = slices.Insert(devices, at, fresh.Devices...)
	set := mig.CounterSetName(gpu.Index)
	out.CounterSets = slices.DeleteFunc(slices.Clone(inv.CounterSets), func(cs resourceapi.CounterSet) bool { return cs.Name == set })
	out.CounterSets = append(out.CounterSets, fresh.CounterSets...)
	return out
}

func apisOf(devices []AllocatableDevice, uuid string) []resourceapi.Device {
	var out []resourceapi.Device
	for _, d := range devices {
		if d.GPU.UUID == uuid {
			out = append(out, d.API)
		}
	}
	return out
}

func namesOf(devices []AllocatableDevice) []string {
	out := make([]string, 0, len(devices))
	for _, d := range devices {
		out = append(out, d.Name())
	}
	return out
}
