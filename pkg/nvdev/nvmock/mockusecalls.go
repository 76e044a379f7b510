package nvmock

import (
	"slices"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

// useView is one GPU's use at one moment: the values set on it and its
// instances, its processes, and which instances there are.
type useView struct {
	gpu   *mockUseState
	procs []mockProcessState
	// gis are the GPU instances the GPU has, by ID, with their use (nil
	// for one never set).
	gis map[uint32]*mockUseState
	mig bool
}

func useViewOf(g *mockGPUState) useView {
	v := useView{gpu: g.Use, procs: g.Processes, gis: map[uint32]*mockUseState{}, mig: g.MigMode == nvml.DEVICE_MIG_ENABLE}
	for _, gi := range g.GIs {
		v.gis[gi.ID] = gi.Use
	}
	return v
}

// alive are the processes that run: on the whole GPU while MIG is off, on
// an instance while it exists.
func (v useView) alive() []mockProcessState {
	return slices.DeleteFunc(slices.Clone(v.procs), func(p mockProcessState) bool {
		if p.GpuInstanceID == WholeGPU {
			return v.mig
		}
		_, ok := v.gis[p.GpuInstanceID]
		return !ok || !v.mig
	})
}

func (v useView) onInstance(gi, ci uint32) []mockProcessState {
	return slices.DeleteFunc(v.alive(), func(p mockProcessState) bool {
		return p.GpuInstanceID != gi || p.ComputeInstanceID != ci
	})
}

func (v useView) onGI(gi uint32) []mockProcessState {
	return slices.DeleteFunc(v.alive(), func(p mockProcessState) bool { return p.GpuInstanceID != gi })
}

func (v useView) gpuSM() uint32 {
	return max(v.gpu.get().SMUtil, sumPercent(v.onGI(WholeGPU), func(p mockProcessState) uint32 { return p.SMUtil }))
}

func (v useView) gpuMemUtil() uint32 {
	return max(v.gpu.get().MemUtil, sumPercent(v.onGI(WholeGPU), func(p mockProcessState) uint32 { return p.MemUtil }))
}

func (v useView) gpuMemoryUsed() uint64 {
	used := sumMemory(v.onGI(WholeGPU))
	for id := range v.gis {
		used += v.giMemoryUsed(id)
	}
	return max(v.gpu.get().MemoryUsed, used)
}

func (v useView) giSM(gi uint32) uint32 {
	return max(v.gis[gi].get().SMUtil, sumPercent(v.onGI(gi), func(p mockProcessState) uint32 { return p.SMUtil }))
}

func (v useView) giMemoryUsed(gi uint32) uint64 {
	return max(v.gis[gi].get().MemoryUsed, sumMemory(v.onGI(gi)))
}

// get is the use, zero for none set.
func (u *mockUseState) get() mockUseState {
	if u == nil {
		return mockUseState{}
	}
	return *u
}

// sumPercent adds the processes' shares of a GPU's time: it is busy at
// most all the time.
func sumPercent(procs []mockProcessState, share func(mockProcessState) uint32) uint32 {
	var sum uint32
	for _, p := range procs {
		sum += share(p)
	}
	return min(sum, 100)
}

func sumMemory(procs []mockProcessState) uint64 {
	var sum uint64
	for _, p := range procs {
		sum += p.MemoryUsed
	}
	return sum
}

// useSource tells what a GPU is doing now.
type useSource interface {
	useOf(d *server.Device) (useView, nvml.Return)
}

// idleUse is the use of a machine kept in memory: nothing sets any, so
// its GPUs are idle, and NVML says so rather than fail.
type idleUse struct{}

func (idleUse) useOf(d *server.Device) (useView, nvml.Return) {
	d.RLock()
	defer d.RUnlock()
	v := useView{gis: map[uint32]*mockUseState{}, mig: d.MigMode == nvml.DEVICE_MIG_ENABLE}
	for gi := range d.GpuInstances {
		v.gis[gi.Info.Id] = nil
	}
	return v, nvml.SUCCESS
}

// useOf is the use of a GPU of the persistent machine, as its state file
// holds it now.
func (m *mockMachine) useOf(d *server.Device) (useView, nvml.Return) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.syncLocked(); err != nil {
		m.report(err)
		return useView{}, nvml.ERROR_UNKNOWN
	}
	i := slices.IndexFunc(m.gpus, func(g *mockGPU) bool { return g.d == d })
	if i < 0 {
		return useView{}, nvml.ERROR_INVALID_ARGUMENT
	}
	g := m.gpus[i]
	v := useView{gpu: g.use, procs: g.procs, gis: map[uint32]*mockUseState{}}
	d.RLock()
	defer d.RUnlock()
	v.mig = d.MigMode == nvml.DEVICE_MIG_ENABLE
	for gi := range d.GpuInstances {
		v.gis[gi.Info.Id] = nil
		if mg, ok := m.gis[gi]; ok {
			v.gis[gi.Info.Id] = mg.use
		}
	}
	return v, nvml.SUCCESS
}

// useLayer answers NVML's use calls (mockuse.go) of one machine.
type useLayer struct {
	s   *server.Server
	src useSource
	// faults are the persistent machine's (lost GPUs, use calls switched
	// off); nil for a machine kept in memory, which has none.
	faults *mockFaults
}

// completeUse makes a machine's GPUs and MIG devices answer the use calls
// from src. It wraps what earlier layers set (the faults' lost-GPU
// guards, the holders a GPU lists), so it comes after them.
func completeUse(s *server.Server, src useSource, faults *mockFaults) {
	u := &useLayer{s: s, src: src, faults: faults}
	for _, dev := range s.Devices {
		u.completeGPU(dev.(*server.Device))
	}
	byUUID := s.DeviceGetHandleByUUIDFunc
	s.DeviceGetHandleByUUIDFunc = func(id string) (nvml.Device, nvml.Return) {
		d, ret := byUUID(id)
		return u.completeMigHandle(d), ret
	}
	name := s.SystemGetProcessNameFunc
	s.SystemGetProcessNameFunc = func(pid int) (string, nvml.Return) {
		if n := u.processName(pid); n != "" {
			return n, nvml.SUCCESS
		}
		return name(pid)
	}
	u.completeGPM(s)
}

// answer is what a use call on a GPU answers before its work: a lost GPU
// is lost, one whose use calls are switched off does not support them.
func (u *useLayer) answer(uuid string) nvml.Return {
	if u.faults == nil {
		return nvml.SUCCESS
	}
	g, ok := u.faults.gpuFaults(uuid)
	switch {
	case !ok:
		return nvml.ERROR_UNKNOWN
	case g.Lost:
		return nvml.ERROR_GPU_IS_LOST
	case g.UseUnsupported:
		return nvml.ERROR_NOT_SUPPORTED
	}
	return nvml.SUCCESS
}

// reachable is answer for the calls every driver has.
func (u *useLayer) reachable(uuid string) nvml.Return {
	if u.faults == nil {
		return nvml.SUCCESS
	}
	return u.faults.reachable(uuid)
}

// view is a GPU's use for a call that needs it supported.
func (u *useLayer) view(d *server.Device) (useView, nvml.Return) {
	if ret := u.answer(d.UUID); ret != nvml.SUCCESS {
		return useView{}, ret
	}
	return u.src.useOf(d)
}

func (u *useLayer) completeGPU(d *server.Device) {
	getMem := d.GetMemoryInfoFunc
	d.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
		mem, ret := getMem()
		if ret != nvml.SUCCESS {
			return mem, ret
		}
		v, ret := u.src.useOf(d)
		if ret != nvml.SUCCESS {
			return nvml.Memory{}, ret
		}
		return memoryOf(mem.Total, v.gpuMemoryUsed()), nvml.SUCCESS
	}
	d.GetMemoryInfo_v2Func = func() (nvml.Memory_v2, nvml.Return) { return memoryV2(u.answer(d.UUID), d.GetMemoryInfo) }
	d.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) {
		v, ret := u.view(d)
		switch {
		case ret != nvml.SUCCESS:
			return nvml.Utilization{}, ret
		case v.mig: // nvml.h: not supported on MIG-enabled GPUs
			return nvml.Utilization{}, nvml.ERROR_NOT_SUPPORTED
		}
		return nvml.Utilization{Gpu: v.gpuSM(), Memory: v.gpuMemUtil()}, nvml.SUCCESS
	}
	d.GetProcessUtilizationFunc = func(lastSeen uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
		v, ret := u.view(d)
		switch {
		case ret != nvml.SUCCESS:
			return nil, ret
		case v.mig: // nvml.h: not supported on MIG-enabled GPUs
			return nil, nvml.ERROR_NOT_SUPPORTED
		}
		return processSamples(v.onGI(WholeGPU), lastSeen)
	}
	listed := d.GetComputeRunningProcessesFunc // the holders, for a persistent machine
	d.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
		procs, ret := listed()
		if ret != nvml.SUCCESS {
			return nil, ret
		}
		v, ret := u.src.useOf(d)
		if ret != nvml.SUCCESS {
			return nil, ret
		}
		return append(procs, processInfos(v.alive())...), nvml.SUCCESS
	}
	// The simulated machine keeps every process in the compute list, as
	// the simulated library does (it exports no MPS list): the MPS list is
	// not supported, which the sampler reads as "no MPS clients listed
	// apart" (without it, go-nvml's mock panics on the nil func).
	d.GetMPSComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
		return nil, notSupportedUnless(u.answer(d.UUID))
	}
	migByIndex := d.GetMigDeviceHandleByIndexFunc
	d.GetMigDeviceHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) {
		m, ret := migByIndex(i)
		return u.completeMigHandle(m), ret
	}
	d.GpmQueryDeviceSupportFunc = func() (nvml.GpmSupport, nvml.Return) { return u.gpmSupport(d) }
	d.GpmSampleGetFunc = func(s nvml.GpmSample) nvml.Return { return s.Get(d) }
	d.GpmMigSampleGetFunc = func(gi int, s nvml.GpmSample) nvml.Return { return s.MigGet(d, gi) }
}

// completeMigHandle makes a MIG device handle answer the use calls of its
// GPU instance (and, for the processes, its compute instance).
func (u *useLayer) completeMigHandle(dev nvml.Device) nvml.Device {
	md, ok := dev.(*mock.Device)
	if !ok || md.GetDeviceHandleFromMigDeviceHandleFunc == nil || md.GetMemoryInfoFunc == nil {
		return dev
	}
	parent, ret := md.GetDeviceHandleFromMigDeviceHandle()
	d, ok := parent.(*server.Device)
	if ret != nvml.SUCCESS || !ok {
		return dev
	}
	giID, ret1 := md.GetGpuInstanceId()
	ciID, ret2 := md.GetComputeInstanceId()
	if ret1 != nvml.SUCCESS || ret2 != nvml.SUCCESS {
		return dev
	}
	gi, ci := uint32(giID), uint32(ciID)
	getMem := md.GetMemoryInfoFunc // the instance's size, guarded for a lost GPU
	md.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
		mem, ret := getMem()
		if ret != nvml.SUCCESS {
			return mem, ret
		}
		v, ret := u.src.useOf(d)
		if ret != nvml.SUCCESS {
			return nvml.Memory{}, ret
		}
		return memoryOf(mem.Total, v.giMemoryUsed(gi)), nvml.SUCCESS
	}
	md.GetMemoryInfo_v2Func = func() (nvml.Memory_v2, nvml.Return) { return memoryV2(u.answer(d.UUID), md.GetMemoryInfo) }
	// nvml.h: utilization rates and process utilization are not supported
	// on MIG devices; their SM activity is GPM's.
	md.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) {
		return nvml.Utilization{}, notSupportedUnless(u.answer(d.UUID))
	}
	md.GetProcessUtilizationFunc = func(uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
		return nil, notSupportedUnless(u.answer(d.UUID))
	}
	md.GetMPSComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
		return nil, notSupportedUnless(u.answer(d.UUID))
	}
	md.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
		if ret := u.reachable(d.UUID); ret != nvml.SUCCESS {
			return nil, ret
		}
		v, ret := u.src.useOf(d)
		if ret != nvml.SUCCESS {
			return nil, ret
		}
		return processInfos(v.onInstance(gi, ci)), nvml.SUCCESS
	}
	md.GpmQueryDeviceSupportFunc = func() (nvml.GpmSupport, nvml.Return) { return u.gpmSupport(d) }
	md.GpmSampleGetFunc = func(s nvml.GpmSample) nvml.Return { return s.Get(md) }
	return md
}

// notSupportedUnless is ERROR_NOT_SUPPORTED, or the more pressing answer
// a GPU gives first (lost).
func notSupportedUnless(ret nvml.Return) nvml.Return {
	if ret != nvml.SUCCESS {
		return ret
	}
	return nvml.ERROR_NOT_SUPPORTED
}

func (u *useLayer) processName(pid int) string {
	for _, dev := range u.s.Devices {
		v, ret := u.src.useOf(dev.(*server.Device))
		if ret != nvml.SUCCESS {
			continue
		}
		for _, p := range v.alive() {
			if int(p.PID) == pid && p.Name != "" {
				return p.Name
			}
		}
	}
	return ""
}

func memoryOf(total, used uint64) nvml.Memory {
	used = min(used, total)
	return nvml.Memory{Total: total, Used: used, Free: total - used}
}

// memoryV2 is GetMemoryInfo_v2 from GetMemoryInfo, unless the call is
// not to be answered (pre).
func memoryV2(pre nvml.Return, v1 func() (nvml.Memory, nvml.Return)) (nvml.Memory_v2, nvml.Return) {
	if pre != nvml.SUCCESS {
		return nvml.Memory_v2{}, pre
	}
	mem, ret := v1()
	if ret != nvml.SUCCESS {
		return nvml.Memory_v2{}, ret
	}
	return nvml.Memory_v2{Version: nvml.STRUCT_VERSION(nvml.Memory_v2{}, 2), Total: mem.Total, Used: mem.Used, Free: mem.Free}, nvml.SUCCESS
}

func processInfos(procs []mockProcessState) []nvml.ProcessInfo {
	out := make([]nvml.ProcessInfo, 0, len(procs))
	for _, p := range procs {
		out = append(out, nvml.ProcessInfo{Pid: p.PID, UsedGpuMemory: p.MemoryUsed,
			GpuInstanceId: p.GpuInstanceID, ComputeInstanceId: p.ComputeInstanceID})
	}
	return out
}

// processSamples are GetProcessUtilization's answer: one sample per
// process with some utilization, recorded now (microseconds, the CPU
// clock), or ERROR_NOT_FOUND when there is none newer than lastSeen.
func processSamples(procs []mockProcessState, lastSeen uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
	now := uint64(time.Now().UnixMicro())
	var out []nvml.ProcessUtilizationSample
	for _, p := range procs {
		if now > lastSeen && (p.SMUtil > 0 || p.MemUtil > 0) {
			out = append(out, nvml.ProcessUtilizationSample{Pid: p.PID, TimeStamp: now, SmUtil: p.SMUtil, MemUtil: p.MemUtil})
		}
	}
	if len(out) == 0 {
		return nil, nvml.ERROR_NOT_FOUND
	}
	return out, nvml.SUCCESS
}
