package plugin

import (
	"context"
	"slices"

	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/device"
	"k8s.io/klog/v2"
)

// gpuRebound republishes a GPU's devices with its new minor number, and
// has the health monitor register the GPU for its events again: a
// registration made before the re-bind may deliver none.
func (d *Driver) gpuRebound(ctx context.Context, uuid string, minor int) {
	if d.reregister != nil {
		d.reregister()
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	inv := d.inv
	inv.Devices = slices.Clone(inv.Devices)
	for i := range inv.Devices {
		if inv.Devices[i].GPU.UUID == uuid {
			inv.Devices[i] = *device.WithMinor(&inv.Devices[i], minor)
		}
	}
	d.inv = inv
	if d.pub == nil {
		return // restoring: the first publish has it
	}
	if err := d.publishLocked(ctx); err != nil {
		klog.FromContext(ctx).Error(err, "Publishing the devices of a re-bound GPU", "gpu", uuid)
	}
}
