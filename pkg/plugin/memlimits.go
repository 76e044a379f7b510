package plugin

import (
	"context"

	"github.com/gpuaas/gpu-dra-driver/pkg/cdi"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/inventory"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/prepare"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/telemetry"
	"k8s.io/klog/v2"
)

// memoryLimiter is a CDI writer that writes the driver's memory limits
// where the node enforces them (cdi.Handler), and says whether it does.
type memoryLimiter interface {
	MemoryLimits() cdi.MemoryLimits
}

// ReasonMemoryLimitsNotEnforced is the Node event of a node whose
// time-slice replicas or memory shares the driver does not hold to their
// memory.
const ReasonMemoryLimitsNotEnforced = "MemoryLimitsNotEnforced"

// withMemoryLimits publishes, on each replica and share, whether the
// driver holds its containers to its memory, as the CDI writer writes
// the specs; where it does not, it says why in the log, a Node event (only
// where such devices are offered) and the metric.
func withMemoryLimits(ctx context.Context, inv inventory.Inventory, w prepare.CDIWriter, events telemetry.NodeEvents, metrics *telemetry.Metrics) inventory.Inventory {
	limits := memoryLimitsOf(w)
	metrics.SetMemoryLimits(limits.Enforced, limits.Cause)
	logger := klog.FromContext(ctx)
	if limits.Enforced {
		logger.Info("The driver holds each container of a time-slice replica or memory share to the device's memory")
		return inv.WithMemoryLimits(true)
	}
	var shared []string
	for _, d := range inv.Devices {
		if d.DriverLimitsMemory() {
			shared = append(shared, d.Name())
		}
	}
	logger.Info("Device memory of time-slice replicas and memory shares is not enforced: a container of one can use the whole GPU's memory",
		"cause", limits.Cause, "reason", limits.Reason, "devices", len(shared))
	if len(shared) > 0 {
		events.Warn(ReasonMemoryLimitsNotEnforced, "PublishDevices",
			"%d time-slice replicas and memory shares are offered, but the driver does not hold their containers to their memory (%s): %s",
			len(shared), limits.Cause, limits.Reason)
	}
	return inv.WithMemoryLimits(false)
}

// memoryLimitsOf is whether the CDI writer's specs carry the driver's
// memory limits, and why not.
func memoryLimitsOf(w prepare.CDIWriter) cdi.MemoryLimits {
	if ml, ok := w.(memoryLimiter); ok {
		return ml.MemoryLimits()
	}
	return cdi.MemoryLimits{Cause: cdi.CauseHooksDisabled, Reason: "the CDI writer writes no memory limits"}
}
