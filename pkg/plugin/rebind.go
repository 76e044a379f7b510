package plugin

import (
	"context"
	"fmt"
	"maps"
	"slices"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
)

// A MIG mode change may re-bind the GPU: NVML's documentation of
// nvmlDeviceSetMigMode says it "may unbind or reset the device ... the
// attributes associated with the device, such as minor number, might
// change. The caller of this API is expected to query such attributes
// again." The plugin read each GPU's minor number once, at start, and wrote
// it into every CDI spec as /dev/nvidia<minor>: after a re-bind a
// container got another GPU's node, or none. So after setting a GPU's MIG
// mode it asks NVML again, and what it publishes and writes follows.

// requery asks NVML again for a GPU whose MIG mode the plugin may just
// have changed: a new handle by UUID (the cached one may be stale after a
// re-bind, so it is forgotten and the new one cached), and its minor
// number. It returns the handle and the device as it is now (a copy with
// the new minor if the GPU was re-bound, which is then published too).
func (s *State) requery(ctx context.Context, d *AllocatableDevice) (nvml.Device, *AllocatableDevice, error) {
	s.nvml.ForgetHandle(d.GPU.UUID)
	dev, err := s.nvml.DeviceByUUID(d.GPU.UUID)
	if err != nil {
		return nil, nil, fmt.Errorf("getting the handle of GPU %s again after setting its MIG mode: %w", d.GPU.UUID, err)
	}
	minor, ret := dev.GetMinorNumber()
	if ret != nvml.SUCCESS {
		return nil, nil, fmt.Errorf("getting the minor number of GPU %s again after setting its MIG mode: %w", d.GPU.UUID, ret)
	}
	if minor == d.GPU.Minor {
		return dev, d, nil
	}
	klog.FromContext(ctx).Info("GPU re-bound with a new minor number after its MIG mode changed; its device nodes follow",
		"gpu", d.GPU.UUID, "index", d.GPU.Index, "oldMinor", d.GPU.Minor, "minor", minor)
	s.gpuRebound(ctx, d.GPU.UUID, minor)
	return dev, withMinor(d, minor), nil
}

// gpuRebound makes the published devices of a GPU carry its new minor
// number: those State plans claims with, and through onRebound those the
// driver publishes (and the health monitor registers the GPU for its
// events again). The callers have the GPU's handle renewed already
// (requery, rereadMinor's WithHandle).
func (s *State) gpuRebound(ctx context.Context, uuid string, minor int) {
	s.devMu.Lock()
	changed := false
	next := make(map[string]*AllocatableDevice, len(s.devices))
	for name, d := range s.devices {
		if d.GPU.UUID == uuid && d.GPU.Minor != minor {
			d, changed = withMinor(d, minor), true
		}
		next[name] = d
	}
	s.devices = next
	s.devMu.Unlock()
	// Told once per re-bind, not once per device of a claim on the GPU.
	if changed && s.onRebound != nil {
		s.onRebound(ctx, uuid, minor)
	}
}

// withMinor is a copy of d on its GPU's new minor number. The copy shares
// nothing it changes with d, which claims already planned may hold.
func withMinor(d *AllocatableDevice, minor int) *AllocatableDevice {
	out := *d
	out.GPU.Minor = minor
	out.API.Attributes = maps.Clone(d.API.Attributes)
	if _, ok := out.API.Attributes["minor"]; ok {
		out.API.Attributes["minor"] = intAttr(minor)
	}
	return &out
}

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
			inv.Devices[i] = *withMinor(&inv.Devices[i], minor)
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

func intAttr(n int) resourceapi.DeviceAttribute {
	return resourceapi.DeviceAttribute{IntValue: ptr.To(int64(n))}
}
