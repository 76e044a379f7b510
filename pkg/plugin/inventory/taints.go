package inventory

import (
	"slices"

	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/device"

	"github.com/gpuaas/gpu-dra-driver/pkg/health"
	resourceapi "k8s.io/api/resource/v1"
)

// FaultsOf returns the faults that concern dev: those of its GPU as a
// whole, and those of its own MIG device. A fault of one MIG device does
// not concern its siblings or the GPU offered whole: they are other
// hardware slices, and the counters keep the GPU from being handed out
// whole while the faulty device's placement is in use.
func FaultsOf(dev *device.AllocatableDevice, faults []health.Fault) []health.Fault {
	var out []health.Fault
	for _, f := range faults {
		if f.GPU != dev.GPU.UUID {
			continue
		}
		if f.MIG != nil {
			own := dev.MIGScope()
			if own == nil || own.GIProfileID != f.MIG.GIProfileID || own.Placement != f.MIG.Placement {
				continue
			}
		}
		out = append(out, f)
	}
	return out
}

// TaintsOf are dev's published taints: one per fault kind (the latest
// fault's value), after any the device already has, at most the API's 16.
func TaintsOf(dev *device.AllocatableDevice, faults []health.Fault) []resourceapi.DeviceTaint {
	taints := slices.Clone(dev.API.Taints)
	for _, f := range FaultsOf(dev, faults) {
		t := f.Taint()
		if i := slices.IndexFunc(taints, func(o resourceapi.DeviceTaint) bool { return o.Key == t.Key }); i >= 0 {
			taints[i] = t
			continue
		}
		if len(taints) < resourceapi.DeviceTaintsMaxLength {
			taints = append(taints, t)
		}
	}
	return taints
}

// WithFaults returns inv with the faults as taints on its devices; inv
// itself is left as discovered.
func (inv Inventory) WithFaults(faults []health.Fault) Inventory {
	if len(faults) == 0 {
		return inv
	}
	out := inv
	out.Devices = slices.Clone(inv.Devices)
	for i := range out.Devices {
		out.Devices[i].API.Taints = TaintsOf(&out.Devices[i], faults)
	}
	return out
}
