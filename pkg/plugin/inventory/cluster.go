package inventory

import (
	"slices"

	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/device"
	"github.com/gpuaas/gpu-dra-driver/pkg/sliceprobe"
	resourceapi "k8s.io/api/resource/v1"
)

// ForCluster is the inventory as a cluster that keeps s can take it, so
// that no device is published that the scheduler could hand out twice:
//   - counters dropped: WithoutCounters (no dynamic MIG, no milliunits);
//   - counters only beside their devices (1.34): each counter set goes in
//     the slices of the devices that consume it (Resources);
//   - no consumable capacity: no memory shares, which would be stored as
//     exclusive devices that every claim's capacity request fails on.
//
// Taints are the publish's business (TaintsFor): they change with faults.
func (inv Inventory) ForCluster(s sliceprobe.Support) Inventory {
	out := inv
	if s.Counters == sliceprobe.CountersDropped {
		out, _, _ = out.WithoutCounters()
	}
	out.countersBeside = s.Counters == sliceprobe.CountersInDeviceSlice
	if !s.ConsumableCapacity {
		out = out.without((*device.AllocatableDevice).MultiAllocatable)
	}
	return out
}

// TaintsFor is the inventory with only the taints the cluster keeps. Where
// it keeps none, a device that a fault keeps work off (NoSchedule,
// NoExecute) is not published at all: untainted, it would be handed out.
// Taints with effect None only inform, and go where they cannot be kept.
// Over the cluster's limit per device, the ones that keep work off win.
func (inv Inventory) TaintsFor(s sliceprobe.Support) Inventory {
	out := inv
	if !s.Taints {
		out = out.without(func(d *device.AllocatableDevice) bool { return slices.ContainsFunc(d.API.Taints, keepsWorkOff) })
	}
	out.Devices = slices.Clone(out.Devices)
	for i := range out.Devices {
		out.Devices[i].API.Taints = keptTaints(out.Devices[i].API.Taints, s)
	}
	return out
}

func keptTaints(taints []resourceapi.DeviceTaint, s sliceprobe.Support) []resourceapi.DeviceTaint {
	if !s.Taints || len(taints) == 0 {
		return nil
	}
	out := slices.Clone(taints)
	if !s.TaintEffectNone {
		out = slices.DeleteFunc(out, func(t resourceapi.DeviceTaint) bool { return !keepsWorkOff(t) })
	}
	if len(out) > s.MaxTaints {
		slices.SortStableFunc(out, func(a, b resourceapi.DeviceTaint) int { return severity(b) - severity(a) })
		out = out[:s.MaxTaints]
	}
	return out
}

func keepsWorkOff(t resourceapi.DeviceTaint) bool { return severity(t) > 0 }

func severity(t resourceapi.DeviceTaint) int {
	switch t.Effect {
	case resourceapi.DeviceTaintEffectNoExecute:
		return 2
	case resourceapi.DeviceTaintEffectNoSchedule:
		return 1
	}
	return 0
}
