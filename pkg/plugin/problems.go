package plugin

import (
	"context"
	"fmt"
	"slices"
	"strconv"

	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/checkpoint"
	"github.com/prometheus/client_golang/prometheus"
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

// gpuProblems are the GPUs enumeration could not read, and the devices of
// prepared claims on GPUs it did not find: they cannot be prepared again,
// but their claims must still be unprepared, and their pods told.
type gpuProblems struct {
	problems []nvdev.Problem
	// missing are the GPUs known (named by NVML, or by a prepared claim's
	// record) but not enumerated, by UUID, with what is known of why.
	missing map[string]string
	// orphans are the prepared devices on missing GPUs, with just enough
	// (name, GPU UUID) to report their health.
	orphans []AllocatableDevice
}

// findGPUProblems compares what enumeration found with what prepared
// claims hold.
func findGPUProblems(lib nvdev.Interface, records []*checkpoint.Claim) gpuProblems {
	p := gpuProblems{problems: lib.Problems(), missing: map[string]string{}}
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
			if !slices.ContainsFunc(p.orphans, func(o AllocatableDevice) bool { return o.Name() == d.Device }) {
				o := AllocatableDevice{GPU: nvdev.GPU{UUID: d.GPUUUID}}
				o.API.Name = d.Device
				p.orphans = append(p.orphans, o)
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

// report says what is wrong: a log line and a Node event per GPU, and the
// gpu_problems metric; the monitor is told of the missing GPUs.
func (p gpuProblems) report(ctx context.Context, events nodeEvents, metrics *Metrics, monitor MissingGPUs) {
	logger := klog.FromContext(ctx)
	for _, pr := range p.problems {
		reason := ReasonGPUNotPublished
		if pr.Published {
			reason = ReasonGPUAttributeUnknown
		}
		logger.Error(pr.Err, "GPU not fully readable", "index", pr.Index, "gpu", pr.UUID, "pciBusID", pr.PCIBusID,
			"reason", pr.Reason(), "published", pr.Published)
		events.warn(reason, "Enumerate", "%s", pr.String())
	}
	metrics.setGPUProblems(p.problems)
	if monitor != nil && len(p.missing) > 0 {
		monitor.SetMissing(ctx, p.missing)
	}
}

// gpuProblemsMetric is registered with the others (NewMetrics).
func newGPUProblemsMetric() *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: metricsNamespace, Name: "gpu_problems",
		Help: "GPUs enumeration could not read completely at start-up, by index, UUID (empty when NVML could not tell) and reason: gpu-lost or unreadable (not published), unknown-attribute (published with brand or architecture Unknown).",
	}, []string{"index", "gpu", "reason"})
}

func (m *Metrics) setGPUProblems(problems []nvdev.Problem) {
	if m == nil {
		return
	}
	m.gpuProblems.Reset()
	for _, pr := range problems {
		m.gpuProblems.WithLabelValues(strconv.Itoa(pr.Index), pr.UUID, pr.Reason()).Set(1)
	}
}
