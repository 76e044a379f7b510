package prepare

import (
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/utils/ptr"

	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/checkpoint"
)

// What a claim's checkpoint record says, in the shapes its callers need:
// the kubelet's answer, the device names of logs and events, the GPUs
// whose locks cover it.

// kubeletDevices is the kubelet's answer to a prepared claim.
func kubeletDevices(rec *checkpoint.Claim) []kubeletplugin.Device {
	out := make([]kubeletplugin.Device, 0, len(rec.Devices))
	for _, d := range rec.Devices {
		dev := kubeletplugin.Device{
			Requests:     d.Requests,
			PoolName:     d.Pool,
			DeviceName:   d.Device,
			CDIDeviceIDs: d.CDIDeviceIDs,
		}
		if d.ShareID != "" {
			dev.ShareID = ptr.To(types.UID(d.ShareID))
		}
		out = append(out, dev)
	}
	return out
}

// deviceNames are the record's device names.
func deviceNames(rec *checkpoint.Claim) []string {
	out := make([]string, 0, len(rec.Devices))
	for _, d := range rec.Devices {
		out = append(out, d.Device)
	}
	return out
}

// recordGPUs are the GPUs of the record's devices (repeated per device).
func recordGPUs(rec *checkpoint.Claim) []string {
	out := make([]string, 0, len(rec.Devices))
	for _, d := range rec.Devices {
		out = append(out, d.GPUUUID)
	}
	return out
}
