package inventory

import (
	"fmt"
	"slices"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/gpuaas/gpu-dra-driver/pkg/mig"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/device"
	resourceapi "k8s.io/api/resource/v1"
)

// StaticGPU is the inventory of one static-MIG GPU as it is now, with its
// MIG mode read again (mig-manager may have switched it), as a part of
// inv (whose counter-set unit names it keeps).
func (inv Inventory) StaticGPU(lib nvdev.Interface, gpu nvdev.GPU) (Inventory, error) {
	if gpu.MigCapable {
		var current int
		_, err := nvdev.WithHandle(lib, gpu.UUID, func(dev nvml.Device) error {
			var ret nvml.Return
			current, _, ret = dev.GetMigMode()
			return nvdev.Returned(ret)
		})
		if err != nil {
			return Inventory{}, fmt.Errorf("reading MIG mode: %w", err)
		}
		gpu.MigEnabled = current == nvml.DEVICE_MIG_ENABLE
	}
	units := inv.units
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

// WithGPU returns inv with the devices and unit counter set of gpu
// replaced by fresh's, at the place the old ones had (the order of devices
// is the allocator's preference).
func (inv Inventory) WithGPU(gpu nvdev.GPU, fresh Inventory) Inventory {
	out := inv
	at := slices.IndexFunc(inv.Devices, func(d device.AllocatableDevice) bool { return d.GPU.UUID == gpu.UUID })
	devices := slices.DeleteFunc(slices.Clone(inv.Devices), func(d device.AllocatableDevice) bool { return d.GPU.UUID == gpu.UUID })
	if at < 0 {
		at = len(devices)
	}
	out.Devices = slices.Insert(devices, at, fresh.Devices...)
	set := mig.CounterSetName(gpu.Index)
	out.CounterSets = slices.DeleteFunc(slices.Clone(inv.CounterSets), func(cs resourceapi.CounterSet) bool { return cs.Name == set })
	out.CounterSets = append(out.CounterSets, fresh.CounterSets...)
	return out
}

func APIsOf(devices []device.AllocatableDevice, uuid string) []resourceapi.Device {
	var out []resourceapi.Device
	for _, d := range devices {
		if d.GPU.UUID == uuid {
			out = append(out, d.API)
		}
	}
	return out
}

func NamesOf(devices []device.AllocatableDevice) []string {
	out := make([]string, 0, len(devices))
	for _, d := range devices {
		out = append(out, d.Name())
	}
	return out
}

// GPUPart is the part of inv that is GPU uuid's: its devices and its
// counter set (named set), for WithGPU.
func (inv Inventory) GPUPart(uuid, set string) Inventory {
	out := Inventory{ownSlice: map[int]bool{}, layouts: map[string]*mig.Layout{}, units: inv.units}
	for _, d := range inv.Devices {
		if d.GPU.UUID == uuid {
			out.Devices = append(out.Devices, d)
		}
	}
	for _, cs := range inv.CounterSets {
		if cs.Name == set {
			out.CounterSets = append(out.CounterSets, cs)
		}
	}
	if l := inv.layouts[uuid]; l != nil {
		out.layouts[uuid] = l
	}
	return out
}
