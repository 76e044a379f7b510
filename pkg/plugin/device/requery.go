package device

import (
	"context"
	"fmt"
	"maps"

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
func (e *Env) requery(ctx context.Context, d *AllocatableDevice) (nvml.Device, *AllocatableDevice, error) {
	e.NVML.ForgetHandle(d.GPU.UUID)
	dev, err := e.NVML.DeviceByUUID(d.GPU.UUID)
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
	e.rebound(ctx, d.GPU.UUID, minor)
	return dev, WithMinor(d, minor), nil
}

// WithMinor is a copy of d on its GPU's new minor number. The copy shares
// nothing it changes with d, which claims already planned may hold.
func WithMinor(d *AllocatableDevice, minor int) *AllocatableDevice {
	out := *d
	out.GPU.Minor = minor
	out.API.Attributes = maps.Clone(d.API.Attributes)
	if _, ok := out.API.Attributes["minor"]; ok {
		out.API.Attributes["minor"] = IntAttr(minor)
	}
	return &out
}

func IntAttr(n int) resourceapi.DeviceAttribute {
	return resourceapi.DeviceAttribute{IntValue: ptr.To(int64(n))}
}
