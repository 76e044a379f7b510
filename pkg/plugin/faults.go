package plugin

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/gpuaas/gpu-dra-driver/pkg/health"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/checkpoint"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
)

// FaultRecorder is told when tearing a device down fails and when a retry
// succeeds; the health monitor taints the device meanwhile.
type FaultRecorder interface {
	SetCleanupBlocked(ctx context.Context, gpu string, scope *health.MIGScope, err error)
}

// noFaults records nothing: health monitoring is off.
type noFaults struct{}

func (noFaults) SetCleanupBlocked(context.Context, string, *health.MIGScope, error) {}

// migScope is the MIG device a device stands for, nil for the others.
func (d *AllocatableDevice) migScope() *health.MIGScope { return d.kind.migScope() }

// faultsOf returns the faults that concern dev: those of its GPU as a
// whole, and those of its own MIG device. A fault of one MIG device does
// not concern its siblings or the GPU offered whole: they are other
// hardware slices, and the counters keep the GPU from being handed out
// whole while the faulty device's placement is in use.
func faultsOf(dev *AllocatableDevice, faults []health.Fault) []health.Fault {
	var out []health.Fault
	for _, f := range faults {
		if f.GPU != dev.GPU.UUID {
			continue
		}
		if f.MIG != nil {
			own := dev.migScope()
			if own == nil || own.GIProfileID != f.MIG.GIProfileID || own.Placement != f.MIG.Placement {
				continue
			}
		}
		out = append(out, f)
	}
	return out
}

// taintsOf are dev's published taints: one per fault kind (the latest
// fault's value), after any the device already has, at most the API's 16.
func taintsOf(dev *AllocatableDevice, faults []health.Fault) []resourceapi.DeviceTaint {
	taints := slices.Clone(dev.API.Taints)
	for _, f := range faultsOf(dev, faults) {
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

// withFaults returns inv with the faults as taints on its devices; inv
// itself is left as discovered.
func (inv Inventory) withFaults(faults []health.Fault) Inventory {
	if len(faults) == 0 {
		return inv
	}
	out := inv
	out.Devices = slices.Clone(inv.Devices)
	for i := range out.Devices {
		out.Devices[i].API.Taints = taintsOf(&out.Devices[i], faults)
	}
	return out
}

// healthReport is every published device's health: unhealthy while a
// fault with an effect concerns it, with the faults as the message.
func healthReport(nodeName string, devices []AllocatableDevice, faults []health.Fault, now time.Time) kubeletplugin.DeviceHealthReport {
	report := kubeletplugin.DeviceHealthReport{Devices: make([]kubeletplugin.DeviceHealth, 0, len(devices))}
	for i := range devices {
		h := kubeletplugin.DeviceHealth{PoolName: nodeName, DeviceName: devices[i].Name(),
			Health: kubeletplugin.HealthStatusHealthy, LastUpdated: now, HealthCheckTimeout: healthReportTimeout}
		var msgs []string
		for _, f := range faultsOf(&devices[i], faults) {
			if f.Unhealthy() {
				msgs = append(msgs, f.String())
			}
		}
		if len(msgs) > 0 {
			h.Health, h.Message = kubeletplugin.HealthStatusUnhealthy, strings.Join(msgs, "; ")
		}
		report.Devices = append(report.Devices, h)
	}
	return report
}

// Health reports are sent at least every healthResendInterval, well within
// the timeout after which the kubelet calls a device's health unknown.
const (
	healthReportTimeout  = 30 * time.Second
	healthResendInterval = 10 * time.Second
)

// cleanupScope is the MIG device a checkpoint device's teardown is about.
func cleanupScope(d *checkpoint.Device) *health.MIGScope {
	switch {
	case d.CreatedMIG != nil:
		return &health.MIGScope{GIProfileID: d.CreatedMIG.GIProfileID, Placement: d.CreatedMIG.Placement, GIID: d.CreatedMIG.GIID}
	case d.MIGIntent != nil:
		return &health.MIGScope{GIProfileID: d.MIGIntent.GIProfileID, Placement: d.MIGIntent.Placement}
	}
	return nil
}
