package inventory

import (
	"context"
	"fmt"
	"slices"

	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/device"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/telemetry"

	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/checkpoint"
	"k8s.io/klog/v2"
)

// Node event reasons of GPUs enumeration could not read (nvdev.Problem).
const (
	// ReasonGPUNotPublished: a GPU NVML lists could not be read (fallen
	// off the bus, or answering errors); the node's other GPUs are
	// published without it.
	ReasonGPUNotPublished = "GPUNotPublished"
	// ReasonGPUAttributeUnknown: a GPU is published with its brand or
	// architecture "Unknown" (newer than the plugin's go-nvlib).
	ReasonGPUAttributeUnknown = "GPUAttributeUnknown"
)

// MissingGPUs tells the health monitor of GPUs the node is known to have
// that enumeration could not read, so that it reports them as lost (the
// metric, the claims' device status, the kubelet's device health). One
// not published cannot carry a device taint: its devices are not offered.
type MissingGPUs interface {
	SetMissing(ctx context.Context, gpus map[string]string)
}

// GPUProblems are the GPUs enumeration could not read, and the devices of
// prepared claims on GPUs it did not find: they cannot be prepared again,
// but their claims must still be unprepared, and their pods told.
type GPUProblems struct {
	problems []nvdev.Problem
	// missing are the GPUs known (named by NVML, or by a prepared claim's
	// record) but not enumerated, by UUID, with what is known of why.
	missing map[string]string
	// Orphans are the prepared devices on missing GPUs, with just enough
	// (name, GPU UUID) to report their health.
	Orphans []device.AllocatableDevice
}

// FindGPUProblems compares what enumeration found with what prepared
// claims hold.
func FindGPUProblems(lib nvdev.Interface, records []*checkpoint.Claim) GPUProblems {
	p := GPUProblems{problems: lib.Problems(), missing: map[string]string{}}
	for _, pr := range p.problems {
		if !pr.Published && pr.UUID != "" {
			p.missing[pr.UUID] = pr.String()
		}
	}
	found := map[string]bool{}
	for _, g := range lib.GPUs() {
		found[g.UUID] = true
	}
	for _, rec := range records {
		for _, d := range rec.Devices {
			if d.GPUUUID == "" || found[d.GPUUUID] {
				continue
			}
			if _, ok := p.missing[d.GPUUUID]; !ok {
				p.missing[d.GPUUUID] = fmt.Sprintf("GPU %s holds prepared claims but NVML no longer lists it readable (%s)", d.GPUUUID, unreadableSummary(p.problems))
			}
			if !slices.ContainsFunc(p.Orphans, func(o device.AllocatableDevice) bool { return o.Name() == d.Device }) {
				o := device.AllocatableDevice{GPU: nvdev.GPU{UUID: d.GPUUUID}}
				o.API.Name = d.Device
				p.Orphans = append(p.Orphans, o)
			}
		}
	}
	return p
}

func unreadableSummary(problems []nvdev.Problem) string {
	var n int
	for _, pr := range problems {
		if !pr.Published {
			n++
		}
	}
	return fmt.Sprintf("%d GPU(s) unreadable at enumeration", n)
}

// Report says what is wrong: a log line and a Node event per GPU, and the
// gpu_problems metric; the monitor is told of the missing GPUs.
func (p GPUProblems) Report(ctx context.Context, events telemetry.NodeEvents, metrics *telemetry.Metrics, monitor MissingGPUs) {
	logger := klog.FromContext(ctx)
	for _, pr := range p.problems {
		reason := ReasonGPUNotPublished
		if pr.Published {
			reason = ReasonGPUAttributeUnknown
		}
		logger.Error(pr.Err, "GPU not fully readable", "index", pr.Index, "gpu", pr.UUID, "pciBusID", pr.PCIBusID,
			"reason", pr.Reason(), "published", pr.Published)
		events.Warn(reason, "Enumerate", "%s", pr.String())
	}
	metrics.SetGPUProblems(p.problems)
	if monitor != nil && len(p.missing) > 0 {
		monitor.SetMissing(ctx, p.missing)
	}
}
