package usage

// How each kind of device is measured: a whole GPU, a MIG device (GPM),
// the claims of a shared GPU (per process, mapped to pods).

import (
	"context"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
)

// unknown is a sample NVML could not tell.
func unknown(format string, args ...any) sample {
	return sample{why: fmt.Sprintf(format, args...)}
}

// measureGPUGuarded is measureGPU, where an NVML binding that has not the
// call at all (a simulated machine without use state panics on it) makes
// the GPU's use unknown instead of ending the plugin.
func (s *Sampler) measureGPUGuarded(ctx context.Context, gpu string, ds []*trackedDevice, out []measured) (res []measured) {
	start := len(out)
	defer func() {
		if r := recover(); r != nil {
			klog.FromContext(ctx).V(2).Info("NVML cannot sample the GPU's use", "gpu", gpu, "panic", r)
			res = out[:start]
			for _, d := range ds {
				res = append(res, measured{d: d, use: unknown("NVML cannot sample GPU %s: %v", gpu, r)})
			}
		}
	}()
	return s.measureGPU(ctx, gpu, ds, out)
}

// measureGPU measures the devices of one GPU.
func (s *Sampler) measureGPU(ctx context.Context, gpu string, ds []*trackedDevice, out []measured) []measured {
	handle, err := s.opts.NVML.DeviceByUUID(gpu)
	if err != nil {
		for _, d := range ds {
			out = append(out, measured{d: d, use: unknown("GPU %s cannot be read: %v", gpu, err)})
		}
		return out
	}
	var shared []*trackedDevice
	for _, d := range ds {
		switch d.kind {
		case wholeGPU:
			out = append(out, measureWhole(d, handle))
		case migDevice:
			out = append(out, s.measureMIG(ctx, d, handle))
		case sharedGPU:
			shared = append(shared, d)
		}
	}
	if len(shared) > 0 {
		out = s.measureShared(gpu, handle, shared, out)
	}
	return out
}

// retText names an NVML return for a condition's message.
func retText(ret nvml.Return) string {
	switch ret {
	case nvml.ERROR_NOT_SUPPORTED:
		return "NOT_SUPPORTED"
	case nvml.ERROR_GPU_IS_LOST:
		return "GPU_IS_LOST (the GPU fell off the bus)"
	}
	return ret.Error()
}

// measureWhole reads a GPU held whole: its utilization and memory.
func measureWhole(d *trackedDevice, h nvml.Device) measured {
	m := measured{d: d}
	util, ret := h.GetUtilizationRates()
	if ret != nvml.SUCCESS {
		m.use = unknown("GPU utilization: %s", retText(ret))
	} else {
		m.use = sample{known: true, util: float64(util.Gpu)}
	}
	if mem, ret := h.GetMemoryInfo_v2(); ret == nvml.SUCCESS {
		m.memory, m.memKnown = mem.Used, true
	}
	return m
}

// measureMIG reads a MIG device: SM activity from GPM where the GPU has it
// (Hopper and later), memory used from the MIG handle. Utilization rates
// are NOT_SUPPORTED on MIG handles: without GPM the use is unknown.
func (s *Sampler) measureMIG(ctx context.Context, d *trackedDevice, parent nvml.Device) measured {
	m := measured{d: d}
	if d.migUUID == "" {
		m.use = unknown("MIG device %s not found", d.key.device)
		return m
	}
	if mh, err := s.opts.NVML.DeviceByUUID(d.migUUID); err == nil {
		if mem, ret := mh.GetMemoryInfo(); ret == nvml.SUCCESS {
			m.memory, m.memKnown = mem.Used, true
		}
	}
	m.use = s.gpmSMUtil(ctx, d, parent)
	return m
}

// gpmSMUtil is the GPU instance's SM utilization between this pass's GPM
// sample and the previous one; unknown on the first pass and wherever the
// GPU has no GPM.
func (s *Sampler) gpmSMUtil(ctx context.Context, d *trackedDevice, parent nvml.Device) sample {
	g := s.gpuState(d.gpu)
	if !g.gpmAsked {
		support, ret := parent.GpmQueryDeviceSupport()
		if ret != nvml.SUCCESS {
			return unknown("GPM support of GPU %s: %s", d.gpu, retText(ret))
		}
		g.gpmAsked, g.gpmSupported = true, support.IsSupportedDevice != 0
	}
	if !g.gpmSupported {
		return unknown("MIG device utilization: NOT_SUPPORTED (GPU %s has no GPM)", d.gpu)
	}
	st, err := s.gpmSamples(d.key)
	if err != nil {
		return unknown("%v", err)
	}
	if ret := parent.GpmMigSampleGet(d.giID, st.cur); ret != nvml.SUCCESS {
		// The buffers may be of a session released since (maintenance):
		// the next pass allocates new ones.
		_, _ = st.prev.Free(), st.cur.Free()
		delete(s.gpm, d.key)
		return unknown("GPM sample of GPU instance %d: %s", d.giID, retText(ret))
	}
	defer func() { st.prev, st.cur, st.have = st.cur, st.prev, true }()
	if !st.have {
		return sample{pending: true, why: fmt.Sprintf("first GPM sample of GPU instance %d", d.giID)}
	}
	if s.metricsGet == nil {
		s.metricsGet = &nvml.GpmMetricsGetType{}
	}
	mg := s.metricsGet
	mg.NumMetrics, mg.Sample1, mg.Sample2 = 1, st.prev, st.cur
	mg.Metrics[0] = nvml.GpmMetric{MetricId: uint32(nvml.GPM_METRIC_SM_UTIL)}
	if ret := s.opts.NVML.NVML().GpmMetricsGet(mg); ret != nvml.SUCCESS {
		return unknown("GPM metrics: %s", retText(ret))
	}
	if ret := nvml.Return(mg.Metrics[0].NvmlReturn); ret != nvml.SUCCESS {
		return unknown("GPM SM utilization: %s", retText(ret))
	}
	klog.FromContext(ctx).V(6).Info("GPM sample", "device", d.key.device, "smUtil", mg.Metrics[0].Value)
	return sample{known: true, util: mg.Metrics[0].Value}
}

func (s *Sampler) gpuState(gpu string) *gpuState {
	g := s.gpus[gpu]
	if g == nil {
		g = &gpuState{}
		s.gpus[gpu] = g
	}
	return g
}

// gpmSamples are a MIG device's two GPM sample buffers, allocated once.
func (s *Sampler) gpmSamples(key deviceKey) (*gpmState, error) {
	if st := s.gpm[key]; st != nil {
		return st, nil
	}
	lib := s.opts.NVML.NVML()
	prev, ret := lib.GpmSampleAlloc()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("allocating a GPM sample: %s", retText(ret))
	}
	cur, ret := lib.GpmSampleAlloc()
	if ret != nvml.SUCCESS {
		_ = prev.Free()
		return nil, fmt.Errorf("allocating a GPM sample: %s", retText(ret))
	}
	st := &gpmState{prev: prev, cur: cur}
	s.gpm[key] = st
	return st, nil
}

// dropGPM frees the GPM samples of devices no longer tracked.
func (s *Sampler) dropGPM(devices []*trackedDevice) {
	if len(s.gpm) == 0 {
		return
	}
	live := make(map[deviceKey]bool, len(devices))
	for _, d := range devices {
		live[d.key] = true
	}
	for key, st := range s.gpm {
		if !live[key] {
			_, _ = st.prev.Free(), st.cur.Free()
			delete(s.gpm, key)
		}
	}
}

// measureShared splits a shared GPU's use between the claims on it: the
// processes' SM utilization since the last pass (GetProcessUtilization)
// and their memory (the compute and MPS process lists), each PID mapped to
// its pod through its cgroup and each pod to its claim. A claim with no
// process on the GPU uses 0 of it: that is known, NVML lists every
// process. Where the per-process samples cannot be read, every claim's use
// is unknown.
func (s *Sampler) measureShared(gpu string, h nvml.Device, ds []*trackedDevice, out []measured) []measured {
	g := s.gpuState(gpu)
	owner := map[types.UID]*trackedDevice{}
	start := len(out)
	index := map[*trackedDevice]int{}
	for _, d := range ds {
		for uid := range d.pods {
			if owner[uid] == nil {
				owner[uid] = d
			}
		}
		index[d] = len(out)
		out = append(out, measured{d: d, use: sample{known: true}, byPod: map[string]podUse{}})
	}
	samples, ret := h.GetProcessUtilization(g.lastSeen)
	switch ret {
	case nvml.SUCCESS:
		for _, smp := range latestSamples(samples, g.lastSeen) {
			g.lastSeen = max(g.lastSeen, smp.TimeStamp)
			if pod, d := s.ownerOf(smp.Pid, owner); d != nil {
				m := &out[index[d]]
				m.use.util = min(100, m.use.util+float64(smp.SmUtil))
				u := m.byPod[d.pods[pod]]
				u.util = min(100, u.util+float64(smp.SmUtil))
				m.byPod[d.pods[pod]] = u
			}
		}
	case nvml.ERROR_NOT_FOUND:
		// No process ran on the GPU since the last sample: 0 for all.
	default:
		for i := start; i < len(out); i++ {
			out[i].use = unknown("process utilization of GPU %s: %s", gpu, retText(ret))
		}
	}
	memKnown := s.sharedMemory(h, owner, out, index)
	for i := start; i < len(out); i++ {
		out[i].memKnown = memKnown
		for _, name := range out[i].d.pods {
			if _, ok := out[i].byPod[name]; !ok {
				out[i].byPod[name] = podUse{}
			}
		}
	}
	return out
}

// latestSamples keeps each PID's newest sample after lastSeen.
func latestSamples(samples []nvml.ProcessUtilizationSample, lastSeen uint64) []nvml.ProcessUtilizationSample {
	out := samples[:0:0]
	newest := map[uint32]int{}
	for _, smp := range samples {
		if smp.TimeStamp <= lastSeen && lastSeen != 0 {
			continue
		}
		if i, ok := newest[smp.Pid]; ok {
			if smp.TimeStamp > out[i].TimeStamp {
				out[i] = smp
			}
			continue
		}
		newest[smp.Pid] = len(out)
		out = append(out, smp)
	}
	return out
}

// sharedMemory adds each process's memory to its claim; false where the
// compute process list cannot be read. MPS clients are in their own list
// (NOT_SUPPORTED where the driver has none).
func (s *Sampler) sharedMemory(h nvml.Device, owner map[types.UID]*trackedDevice, out []measured, index map[*trackedDevice]int) bool {
	procs, ret := h.GetComputeRunningProcesses()
	if ret != nvml.SUCCESS {
		return false
	}
	if mps, ret := h.GetMPSComputeRunningProcesses(); ret == nvml.SUCCESS {
		procs = append(procs, mps...)
	}
	seen := make(map[uint32]bool, len(procs))
	for _, p := range procs {
		if seen[p.Pid] {
			continue
		}
		seen[p.Pid] = true
		if pod, d := s.ownerOf(p.Pid, owner); d != nil {
			m := &out[index[d]]
			m.memory += p.UsedGpuMemory
			u := m.byPod[d.pods[pod]]
			u.memory += p.UsedGpuMemory
			m.byPod[d.pods[pod]] = u
		}
	}
	return true
}

// ownerOf is the pod of pid and the device of the claim reserved for it on
// this GPU; nil for a process of no claim here (another workload, the MPS
// server, one that exited).
func (s *Sampler) ownerOf(pid uint32, owner map[types.UID]*trackedDevice) (types.UID, *trackedDevice) {
	pod := s.procs.pod(pid)
	if pod == "" {
		return "", nil
	}
	return pod, owner[pod]
}
