package main

import (
	"fmt"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
)

// Use is what a GPU or MIG device answers to the calls a use sampler
// makes, each with its NVML return.
type Use struct {
	Utilization       nvml.Utilization                `json:"utilization"`
	UtilizationRet    nvml.Return                     `json:"utilizationRet"`
	Memory            nvml.Memory_v2                  `json:"memory"`
	MemoryRet         nvml.Return                     `json:"memoryRet"`
	Processes         []nvml.ProcessInfo              `json:"processes"`
	ProcessesRet      nvml.Return                     `json:"processesRet"`
	Samples           []nvml.ProcessUtilizationSample `json:"samples"`
	SamplesRet        nvml.Return                     `json:"samplesRet"`
	GPMSupported      uint32                          `json:"gpmSupported"`
	GPMSupportRet     nvml.Return                     `json:"gpmSupportRet"`
	SMActivity        float64                         `json:"smActivity"`
	SMActivityRet     nvml.Return                     `json:"smActivityRet"`
	SMActivityMetric  nvml.Return                     `json:"smActivityMetricRet"`
	GPMSampleInterval time.Duration                   `json:"gpmSampleInterval"`
}

// readUse reads the use of GPU index, or of the MIG device migUUID,
// through the library: the whole GPU's GPM through its handle, a MIG
// device's through its parent and GPU instance ID, two samples interval
// apart.
func readUse(lib nvdev.Interface, index int, migUUID string, interval time.Duration) (any, error) {
	if migUUID == "" {
		return onGPU(lib, index, func(d nvml.Device) (any, error) {
			return useOf(lib.NVML(), d, func(s nvml.GpmSample) nvml.Return { return lib.NVML().GpmSampleGet(d, s) }, interval), nil
		})
	}
	d, err := lib.DeviceByUUID(migUUID)
	if err != nil {
		return nil, err
	}
	parent, ret := d.GetDeviceHandleFromMigDeviceHandle()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("parent of %s: %v", migUUID, nvml.ErrorString(ret))
	}
	gi, ret := d.GetGpuInstanceId()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("GPU instance of %s: %v", migUUID, nvml.ErrorString(ret))
	}
	return useOf(lib.NVML(), d, func(s nvml.GpmSample) nvml.Return { return lib.NVML().GpmMigSampleGet(parent, gi, s) }, interval), nil
}

func useOf(lib nvml.Interface, d nvml.Device, sample func(nvml.GpmSample) nvml.Return, interval time.Duration) Use {
	var u Use
	u.Utilization, u.UtilizationRet = d.GetUtilizationRates()
	u.Memory, u.MemoryRet = d.GetMemoryInfo_v2()
	u.Processes, u.ProcessesRet = d.GetComputeRunningProcesses()
	u.Samples, u.SamplesRet = d.GetProcessUtilization(0)
	support, ret := lib.GpmQueryDeviceSupport(d)
	u.GPMSupported, u.GPMSupportRet = support.IsSupportedDevice, ret
	u.SMActivity, u.SMActivityRet, u.SMActivityMetric = smActivity(lib, sample, interval)
	u.GPMSampleInterval = interval
	return u
}

// smActivity is GPM's SM utilization between two samples.
func smActivity(lib nvml.Interface, sample func(nvml.GpmSample) nvml.Return, interval time.Duration) (float64, nvml.Return, nvml.Return) {
	var samples [2]nvml.GpmSample
	for i := range samples {
		s, ret := lib.GpmSampleAlloc()
		if ret != nvml.SUCCESS {
			return 0, ret, 0
		}
		defer func() { _ = lib.GpmSampleFree(s) }()
		samples[i] = s
	}
	if ret := sample(samples[0]); ret != nvml.SUCCESS {
		return 0, ret, 0
	}
	time.Sleep(interval)
	if ret := sample(samples[1]); ret != nvml.SUCCESS {
		return 0, ret, 0
	}
	mg := nvml.GpmMetricsGetType{NumMetrics: 1, Sample1: samples[0], Sample2: samples[1]}
	mg.Metrics[0].MetricId = uint32(nvml.GPM_METRIC_SM_UTIL)
	if ret := lib.GpmMetricsGet(&mg); ret != nvml.SUCCESS {
		return 0, ret, 0
	}
	return mg.Metrics[0].Value, nvml.SUCCESS, nvml.Return(mg.Metrics[0].NvmlReturn)
}
