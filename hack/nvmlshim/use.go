package main

/*
#include <stdint.h>
*/
import "C"

import (
	"unsafe"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// The use calls (pkg/nvdev/nvmock/mockuse.go): utilization, per-process
// samples and lists, GPM. Each answers what the Go machine answers.

//export nvmlDeviceGetUtilizationRates
func nvmlDeviceGetUtilizationRates(h C.uintptr_t, out unsafe.Pointer) C.int {
	return onDevice("nvmlDeviceGetUtilizationRates", h, func(d nvml.Device) nvml.Return {
		u, ret := d.GetUtilizationRates()
		if ret == nvml.SUCCESS {
			if out == nil {
				return nvml.ERROR_INVALID_ARGUMENT
			}
			*(*nvml.Utilization)(out) = u
		}
		return ret
	})
}

// nvmlDeviceGetProcessUtilization is NVML's two-step call: a NULL buffer
// asks how many samples there are (ERROR_INSUFFICIENT_SIZE with the
// count, as go-nvml expects), a buffer gets them. No sample newer than
// lastSeen answers ERROR_NOT_FOUND either way.
//
//export nvmlDeviceGetProcessUtilization
func nvmlDeviceGetProcessUtilization(h C.uintptr_t, samples unsafe.Pointer, count *C.uint, lastSeen C.ulonglong) C.int {
	return onDevice("nvmlDeviceGetProcessUtilization", h, func(d nvml.Device) nvml.Return {
		got, ret := d.GetProcessUtilization(uint64(lastSeen))
		if ret != nvml.SUCCESS {
			return ret
		}
		if count == nil {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		room := int(*count)
		*count = C.uint(len(got))
		if samples == nil || room < len(got) {
			return nvml.ERROR_INSUFFICIENT_SIZE
		}
		copy(unsafe.Slice((*nvml.ProcessUtilizationSample)(samples), room), got)
		return nvml.SUCCESS
	})
}

// nvmlDeviceGetComputeRunningProcesses is the first version, whose
// nvmlProcessInfo_v1_t has no instance IDs; go-nvml calls it only where
// the library lacks _v2 and _v3.
//
//export nvmlDeviceGetComputeRunningProcesses
func nvmlDeviceGetComputeRunningProcesses(h C.uintptr_t, count *C.uint, infos unsafe.Pointer) C.int {
	return runningProcesses("nvmlDeviceGetComputeRunningProcesses", h, count, infos, func(room int, ps []nvml.ProcessInfo) {
		out := unsafe.Slice((*nvml.ProcessInfo_v1)(infos), room)
		for i, p := range ps {
			out[i] = nvml.ProcessInfo_v1{Pid: p.Pid, UsedGpuMemory: p.UsedGpuMemory}
		}
	})
}

//export nvmlGpmQueryDeviceSupport
func nvmlGpmQueryDeviceSupport(h C.uintptr_t, out unsafe.Pointer) C.int {
	return call("nvmlGpmQueryDeviceSupport", func(lib nvml.Interface) nvml.Return {
		d, ret := device(h)
		if ret != nvml.SUCCESS {
			return ret
		}
		if out == nil {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		s, ret := lib.GpmQueryDeviceSupport(d)
		if ret == nvml.SUCCESS {
			// The caller's version stays: it is an input.
			(*nvml.GpmSupport)(out).IsSupportedDevice = s.IsSupportedDevice
		}
		return ret
	})
}

// A GPM sample (nvmlGpmSample_t, a struct holding one pointer, passed
// as that pointer) is a handle like a device's.
func gpmSample(h C.uintptr_t) (nvml.GpmSample, nvml.Return) {
	s, ok := handles.get(h).(nvml.GpmSample)
	if !ok {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	return s, nvml.SUCCESS
}

//export nvmlGpmSampleAlloc
func nvmlGpmSampleAlloc(out *C.uintptr_t) C.int {
	return call("nvmlGpmSampleAlloc", func(lib nvml.Interface) nvml.Return {
		if out == nil {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		s, ret := lib.GpmSampleAlloc()
		if ret == nvml.SUCCESS {
			*out = handles.of(s)
		}
		return ret
	})
}

// nvmlGpmSampleFree frees the sample and its handle: a sampler allocates
// samples as it goes.
//
//export nvmlGpmSampleFree
func nvmlGpmSampleFree(h C.uintptr_t) C.int {
	return call("nvmlGpmSampleFree", func(lib nvml.Interface) nvml.Return {
		s, ret := gpmSample(h)
		if ret != nvml.SUCCESS {
			return ret
		}
		ret = lib.GpmSampleFree(s)
		handles.drop(h)
		return ret
	})
}

//export nvmlGpmSampleGet
func nvmlGpmSampleGet(dev, sample C.uintptr_t) C.int {
	return call("nvmlGpmSampleGet", func(lib nvml.Interface) nvml.Return {
		d, ret := device(dev)
		if ret != nvml.SUCCESS {
			return ret
		}
		s, ret := gpmSample(sample)
		if ret != nvml.SUCCESS {
			return ret
		}
		return lib.GpmSampleGet(d, s)
	})
}

//export nvmlGpmMigSampleGet
func nvmlGpmMigSampleGet(dev C.uintptr_t, gi C.uint, sample C.uintptr_t) C.int {
	return call("nvmlGpmMigSampleGet", func(lib nvml.Interface) nvml.Return {
		d, ret := device(dev)
		if ret != nvml.SUCCESS {
			return ret
		}
		s, ret := gpmSample(sample)
		if ret != nvml.SUCCESS {
			return ret
		}
		return lib.GpmMigSampleGet(d, int(gi), s)
	})
}

// cGpmMetricsGet is nvmlGpmMetricsGet_t with its samples as handles.
// Only the metrics' IDs, answers and values are read or written: their
// metricInfo holds C string pointers the caller owns.
type cGpmMetricsGet struct {
	Version    uint32
	NumMetrics uint32
	Sample1    uintptr
	Sample2    uintptr
	Metrics    [nvml.GPM_METRIC_MAX]nvml.GpmMetric
}

//export nvmlGpmMetricsGet
func nvmlGpmMetricsGet(in unsafe.Pointer) C.int {
	return call("nvmlGpmMetricsGet", func(lib nvml.Interface) nvml.Return {
		if in == nil {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		c := (*cGpmMetricsGet)(in)
		if c.Version != nvml.GPM_METRICS_GET_VERSION {
			return nvml.ERROR_ARGUMENT_VERSION_MISMATCH
		}
		s1, ret1 := gpmSample(C.uintptr_t(c.Sample1))
		s2, ret2 := gpmSample(C.uintptr_t(c.Sample2))
		if ret1 != nvml.SUCCESS || ret2 != nvml.SUCCESS || int(c.NumMetrics) > len(c.Metrics) {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		mg := nvml.GpmMetricsGetType{Version: c.Version, NumMetrics: c.NumMetrics, Sample1: s1, Sample2: s2}
		for i := range c.NumMetrics {
			mg.Metrics[i].MetricId = c.Metrics[i].MetricId
		}
		ret := lib.GpmMetricsGet(&mg)
		if ret != nvml.SUCCESS {
			return ret
		}
		for i := range c.NumMetrics {
			c.Metrics[i].NvmlReturn, c.Metrics[i].Value = mg.Metrics[i].NvmlReturn, mg.Metrics[i].Value
		}
		return nvml.SUCCESS
	})
}
