package inventory

import (
	"maps"
	"slices"

	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/device"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/utils/ptr"
)

// WithMemoryLimits is the inventory with each replica and share saying
// whether the driver holds its containers to its memory: enforced is the
// node's (cdi.Handler.MemoryLimits), and only devices the plugin gives a
// limit (not MPS ones) are. Claims select on the attribute; a tenant sees
// there whether what it bought is enforced.
func (inv Inventory) WithMemoryLimits(enforced bool) Inventory {
	inv.Devices = slices.Clone(inv.Devices)
	for i := range inv.Devices {
		d := &inv.Devices[i]
		if !d.SharesGPUMemory() {
			continue
		}
		d.API.Attributes = maps.Clone(d.API.Attributes)
		d.API.Attributes[device.AttrMemoryLimitEnforced] = resourceapi.DeviceAttribute{BoolValue: ptr.To(enforced && d.DriverLimitsMemory())}
	}
	return inv
}
