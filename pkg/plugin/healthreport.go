package plugin

import (
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/device"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/inventory"
	"strings"
	"time"

	"github.com/gpuaas/gpu-dra-driver/pkg/health"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
)

// Health reports are sent at least every healthResendInterval, well within
// the timeout after which the kubelet calls a device's health unknown.
const (
	healthReportTimeout  = 30 * time.Second
	healthResendInterval = 10 * time.Second
)

// healthReport is every published device's health: unhealthy while a
// fault with an effect concerns it, with the faults as the message.
func healthReport(nodeName string, devices []device.AllocatableDevice, faults []health.Fault, now time.Time) kubeletplugin.DeviceHealthReport {
	report := kubeletplugin.DeviceHealthReport{Devices: make([]kubeletplugin.DeviceHealth, 0, len(devices))}
	for i := range devices {
		h := kubeletplugin.DeviceHealth{PoolName: nodeName, DeviceName: devices[i].Name(),
			Health: kubeletplugin.HealthStatusHealthy, LastUpdated: now, HealthCheckTimeout: healthReportTimeout}
		var msgs []string
		for _, f := range inventory.FaultsOf(&devices[i], faults) {
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
