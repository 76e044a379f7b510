package nvmock

import (
	"strings"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

// GPM (GPU performance monitoring, Hopper on) is how NVML measures a MIG
// device's SM activity, which its utilization rates do not tell: a sample
// reads the GPU's (or one GPU instance's) counters, and GpmMetricsGet
// turns two samples into rates over the time between them. The mock's
// counter is the integral of the activity set (mockUseState.SMBusy), so
// two samples measure the mean activity between them, changes included.
//
// The activity set is served as NVML_GPM_METRIC_SM_UTIL ("percentage of
// SMs that were busy"): the metric behind DCGM's SM activity
// (DCGM_FI_PROF_SM_ACTIVE) and nvidia-smi dmon's GPM SM utilization, so
// the one a sampler should read. GRAPHICS_UTIL (the engine busy) and
// SM_OCCUPANCY answer the same value, as for a workload that fills every
// SM it keeps busy; every other metric answers NOT_SUPPORTED in its
// nvmlReturn.

// gpmSMMetrics are the metrics that answer the SM activity.
var gpmSMMetrics = map[uint32]bool{
	uint32(nvml.GPM_METRIC_SM_UTIL):       true,
	uint32(nvml.GPM_METRIC_GRAPHICS_UTIL): true,
	uint32(nvml.GPM_METRIC_SM_OCCUPANCY):  true,
}

// gpmCapable: GPM is there from Hopper on (nvml.h: "For Hopper or newer
// fully supported devices").
func gpmCapable(d *server.Device) bool {
	return d.Config.Architecture >= nvml.DEVICE_ARCH_HOPPER
}

// gpmSample is a GPM sample buffer.
type gpmSample struct {
	u *useLayer

	mu sync.Mutex // guards below
	gpmReading
	freed bool
}

// gpmReading is what a sample read: the counter of one GPU (gi WholeGPU)
// or GPU instance at a time, and its activity then.
type gpmReading struct {
	taken bool
	gpu   string
	gi    uint32
	at    time.Time
	busy  float64
	sm    uint32
}

func (u *useLayer) completeGPM(s *server.Server) {
	s.GpmSampleAllocFunc = func() (nvml.GpmSample, nvml.Return) { return &gpmSample{u: u}, nvml.SUCCESS }
	s.GpmSampleFreeFunc = func(x nvml.GpmSample) nvml.Return { return x.Free() }
	s.GpmSampleGetFunc = func(dev nvml.Device, x nvml.GpmSample) nvml.Return { return x.Get(dev) }
	s.GpmMigSampleGetFunc = func(dev nvml.Device, gi int, x nvml.GpmSample) nvml.Return { return x.MigGet(dev, gi) }
	s.GpmQueryDeviceSupportFunc = func(dev nvml.Device) (nvml.GpmSupport, nvml.Return) { return dev.GpmQueryDeviceSupport() }
	s.GpmMetricsGetFunc = u.gpmMetrics
}

// gpmSupport is GpmQueryDeviceSupport of a GPU or its MIG devices: yes
// from Hopper on, while the use calls are not switched off.
func (u *useLayer) gpmSupport(d *server.Device) (nvml.GpmSupport, nvml.Return) {
	support := nvml.GpmSupport{Version: nvml.GPM_SUPPORT_VERSION}
	switch ret := u.answer(d.UUID); ret {
	case nvml.SUCCESS:
		if gpmCapable(d) {
			support.IsSupportedDevice = 1
		}
	case nvml.ERROR_NOT_SUPPORTED:
	default:
		return nvml.GpmSupport{}, ret
	}
	return support, nvml.SUCCESS
}

func (s *gpmSample) Free() nvml.Return {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.freed {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	s.freed = true
	return nvml.SUCCESS
}

// Get samples a GPU, or a MIG device's GPU instance, through its handle.
func (s *gpmSample) Get(dev nvml.Device) nvml.Return {
	uuid, ret := dev.GetUUID()
	if ret != nvml.SUCCESS {
		return ret
	}
	if !strings.HasPrefix(uuid, "MIG-") {
		return s.take(uuid, WholeGPU)
	}
	parent, ret := dev.GetDeviceHandleFromMigDeviceHandle()
	if ret != nvml.SUCCESS {
		return ret
	}
	gi, ret := dev.GetGpuInstanceId()
	if ret != nvml.SUCCESS {
		return ret
	}
	if uuid, ret = parent.GetUUID(); ret != nvml.SUCCESS {
		return ret
	}
	return s.take(uuid, uint32(gi))
}

// MigGet samples GPU instance gi of the GPU dev.
func (s *gpmSample) MigGet(dev nvml.Device, gi int) nvml.Return {
	uuid, ret := dev.GetUUID()
	if ret != nvml.SUCCESS {
		return ret
	}
	if strings.HasPrefix(uuid, "MIG-") || gi < 0 {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	return s.take(uuid, uint32(gi))
}

func (s *gpmSample) take(uuid string, gi uint32) nvml.Return {
	d := s.u.gpu(uuid)
	if d == nil {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	if !gpmCapable(d) {
		return nvml.ERROR_NOT_SUPPORTED
	}
	v, ret := s.u.view(d)
	if ret != nvml.SUCCESS {
		return ret
	}
	use, sm := v.gpu, v.gpuSM()
	if gi != WholeGPU {
		var ok bool
		if use, ok = v.gis[gi]; !ok || !v.mig {
			return nvml.ERROR_NOT_FOUND
		}
		sm = v.giSM(gi)
	}
	// The wall clock, as the counter's Since (which came through the state
	// file) is: both readings of one interval on the same clock.
	now := time.Now().Round(0)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.freed {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	s.gpmReading = gpmReading{taken: true, gpu: uuid, gi: gi, at: now, busy: use.busyAt(sm, now), sm: sm}
	return nvml.SUCCESS
}

func (s *gpmSample) reading() gpmReading {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gpmReading
}

// gpu is the machine's GPU of a UUID.
func (u *useLayer) gpu(uuid string) *server.Device {
	for _, dev := range u.s.Devices {
		if d := dev.(*server.Device); d.UUID == uuid {
			return d
		}
	}
	return nil
}

// gpmMetrics is GpmMetricsGet: the metrics asked for, between two samples
// of the same GPU or instance, the first taken first.
func (u *useLayer) gpmMetrics(mg *nvml.GpmMetricsGetType) nvml.Return {
	if mg == nil {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	// As go-nvml's library does for its callers (C callers set it).
	mg.Version = nvml.GPM_METRICS_GET_VERSION
	s1, ok1 := mg.Sample1.(*gpmSample)
	s2, ok2 := mg.Sample2.(*gpmSample)
	if !ok1 || !ok2 || int(mg.NumMetrics) > len(mg.Metrics) {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	a, b := s1.reading(), s2.reading()
	if !a.taken || !b.taken || a.gpu != b.gpu || a.gi != b.gi || b.at.Before(a.at) {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	activity := float64(b.sm) // two samples at one instant: the activity then
	if dt := b.at.Sub(a.at).Seconds(); dt > 0 {
		activity = min(max((b.busy-a.busy)/dt, 0), 100)
	}
	for i := range mg.NumMetrics {
		m := &mg.Metrics[i]
		m.Value, m.NvmlReturn = 0, uint32(nvml.ERROR_NOT_SUPPORTED)
		if gpmSMMetrics[m.MetricId] {
			m.Value, m.NvmlReturn = activity, uint32(nvml.SUCCESS)
		}
	}
	return nvml.SUCCESS
}
