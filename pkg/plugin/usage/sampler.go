// Package usage measures what the claims prepared on this node use of their
// devices, not only what they hold: the SM utilization and memory used of
// each prepared device, split by claim and by pod on a shared GPU, judged
// in windows against the claim's idle threshold. It exports the use as
// metrics, tells the device status writer when a device's Idle condition
// changes, and renews the Lease that says its samples are fresh
// (docs/usage.md, "Measuring use").
package usage

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"

	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/checkpoint"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/device"
)

// Defaults of the plugin's flags.
const (
	DefaultInterval = 10 * time.Second
	DefaultWindow   = 30 * time.Second
	DefaultProcRoot = "/proc"
)

// Thresholds resolves a claim's idle threshold (percent of SM
// utilization) from its namespace and its device's DeviceClass.
type Thresholds interface {
	Threshold(namespace, deviceClass string) int32
}

// Options configure a Sampler.
type Options struct {
	NVML nvdev.Interface
	// ProcRoot is where /proc/<pid>/cgroup is read (the host's /proc).
	ProcRoot string
	// Interval between samples, Window the length of a judged window.
	Interval, Window time.Duration
	// Thresholds; nil: 0 for every claim.
	Thresholds Thresholds
	Metrics    *Metrics
	// Devices are the published devices by name, for the existing MIG
	// device a static-MIG device stands for; nil: none.
	Devices func() map[string]*device.AllocatableDevice
	// Changed is told the claim whose Idle condition changed on a device;
	// nil: nobody.
	Changed func(types.UID)
}

// kind is how a device's use is measured.
type kind int

const (
	// wholeGPU: the GPU's own utilization and memory.
	wholeGPU kind = iota
	// migDevice: GPM SM activity of the GPU instance, its memory.
	migDevice
	// sharedGPU: several claims on one GPU (time-slice replicas, memory
	// shares, MPS clients): per-process samples mapped to pods.
	sharedGPU
)

// deviceKey names a prepared device of a claim.
type deviceKey struct {
	claim   types.UID
	device  string
	shareID string
}

// tracked is a prepared claim.
type tracked struct {
	uid             types.UID
	namespace, name string
	// pods are the pods the claim is reserved for, UID to name; replaced,
	// never changed in place, so that a pass reads its snapshot unlocked.
	pods    map[types.UID]string
	devices []*trackedDevice
}

// trackedDevice is a prepared device of a claim and its judge.
type trackedDevice struct {
	key      deviceKey
	claim    *tracked
	gpu      string
	profile  string
	kind     kind
	migUUID  string
	giID     int
	share    float64
	judge    *judge
	prevPods map[string]bool // pod label values exported last pass
	// pods are the claim's pods as of this pass's snapshot; only the
	// sampling goroutine touches them.
	pods map[types.UID]string
}

// Sampler samples the prepared devices' use. Tracking, forgetting and
// reading conditions never wait for a sampling pass: a pass measures a
// snapshot of the devices without the lock and applies what it measured
// under it.
type Sampler struct {
	opts  Options
	procs *procPods

	mu     sync.Mutex
	claims map[types.UID]*tracked

	// Only the sampling goroutine touches what follows.
	gpus map[string]*gpuState
	gpm  map[deviceKey]*gpmState
	// metricsGet is GpmMetricsGet's argument, large (477 metrics), reused.
	metricsGet *nvml.GpmMetricsGetType
}

// gpuState is what a GPU's sampling keeps between passes.
type gpuState struct {
	// lastSeen is the newest process sample seen, NVML's timestamp (µs).
	lastSeen uint64
	// gpm: GpmQueryDeviceSupport answered (once), and what.
	gpmAsked, gpmSupported bool
}

// gpmState is a MIG device's GPM samples: the previous and the current.
type gpmState struct {
	prev, cur nvml.GpmSample
	have      bool // prev holds a sample
}

// New makes a Sampler; Track adds the claims.
func New(opts Options) *Sampler {
	if opts.Interval <= 0 {
		opts.Interval = DefaultInterval
	}
	if opts.Window <= 0 {
		opts.Window = DefaultWindow
	}
	if opts.ProcRoot == "" {
		opts.ProcRoot = DefaultProcRoot
	}
	return &Sampler{opts: opts, procs: newProcPods(opts.ProcRoot), claims: map[types.UID]*tracked{},
		gpus: map[string]*gpuState{}, gpm: map[deviceKey]*gpmState{}}
}

// Interval is the time between samples.
func (s *Sampler) Interval() time.Duration { return s.opts.Interval }

// Track adds a prepared claim from its record, at now, or refreshes its
// pods. A device it already tracks keeps its judge; a new one starts
// Unknown/NoSamples, as every device does after a restart.
func (s *Sampler) Track(rec *checkpoint.Claim, now time.Time) {
	if s == nil || rec == nil || rec.State != checkpoint.PrepareCompleted {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	uid := types.UID(rec.UID)
	c := s.claims[uid]
	if c == nil {
		c = &tracked{uid: uid, namespace: rec.Namespace, name: rec.Name, pods: map[types.UID]string{}}
		for i := range rec.Devices {
			if d := s.newDevice(c, &rec.Devices[i], now); d != nil {
				c.devices = append(c.devices, d)
			}
		}
		s.claims[uid] = c
	}
	c.pods = withPods(c.pods, rec.Pods)
}

// withPods is pods and more, a new map.
func withPods(pods map[types.UID]string, more []checkpoint.Pod) map[types.UID]string {
	out := maps.Clone(pods)
	if out == nil {
		out = make(map[types.UID]string, len(more))
	}
	for _, p := range more {
		out[types.UID(p.UID)] = p.Name
	}
	return out
}

// SetPods adds the pods a claim is reserved for (each prepare of the
// claim passes them: a claim shared by pods is prepared once for each).
func (s *Sampler) SetPods(uid types.UID, pods []checkpoint.Pod) {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if c := s.claims[uid]; c != nil {
		c.pods = withPods(c.pods, pods)
	}
}

// Forget drops an unprepared claim and its metric series.
func (s *Sampler) Forget(uid types.UID) {
	if s == nil {
		return
	}
	s.mu.Lock()
	c := s.claims[uid]
	delete(s.claims, uid)
	s.mu.Unlock()
	if c != nil {
		s.opts.Metrics.forget(c.namespace, c.name)
	}
}

// Condition is the Idle condition of a claim's device; false for a device
// not measured (not tracked, or held for monitoring: admin access).
func (s *Sampler) Condition(uid types.UID, deviceName, shareID string) (Condition, bool) {
	if s == nil {
		return Condition{}, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.claims[uid]
	if c == nil {
		return Condition{}, false
	}
	for _, d := range c.devices {
		if d.key.device == deviceName && d.key.shareID == shareID {
			return d.judge.cond, true
		}
	}
	return Condition{}, false
}

// newDevice is how a recorded device is measured; nil for one that is not:
// a device with admin access is held for monitoring, and its GPU's use is
// not the claim's.
func (s *Sampler) newDevice(c *tracked, d *checkpoint.Device, now time.Time) *trackedDevice {
	if d.AdminAccess {
		return nil
	}
	td := &trackedDevice{key: deviceKey{claim: c.uid, device: d.Device, shareID: d.ShareID}, claim: c,
		gpu: d.GPUUUID, profile: d.DeviceClass, share: d.GPUShare, judge: newJudge(now, s.opts.Window)}
	if td.share <= 0 {
		td.share = 1
	}
	mode, _, _ := strings.Cut(d.GPUMode, "/")
	switch {
	case d.CreatedMIG != nil:
		td.kind, td.migUUID, td.giID = migDevice, d.CreatedMIG.UUID, d.CreatedMIG.GIID
	case mode == string(configapi.MigStatic):
		td.kind = migDevice
		if s.opts.Devices != nil {
			if dev := s.opts.Devices()[d.Device]; dev != nil && dev.StaticInstance() != nil {
				td.migUUID, td.giID = dev.StaticInstance().UUID, dev.StaticInstance().GIID
			}
		}
	case d.Shared || mode == "timeSlicing" || mode == "shared":
		td.kind = sharedGPU
	}
	return td
}

// Run samples every interval until ctx ends.
func (s *Sampler) Run(ctx context.Context) {
	wait.UntilWithContext(ctx, func(ctx context.Context) { s.Sample(ctx, time.Now()) }, s.opts.Interval)
}

// measured is what one pass measured of one device.
type measured struct {
	d   *trackedDevice
	use sample
	// memory used, bytes; memKnown false where NVML could not tell.
	memory   uint64
	memKnown bool
	// byPod is the use split by pod (label value, the pod's name) on a
	// shared GPU; nil elsewhere.
	byPod map[string]podUse
}

type podUse struct {
	util   float64
	memory uint64
}

// Sample makes one sampling pass at now: measures every tracked device,
// judges the samples and exports them.
func (s *Sampler) Sample(ctx context.Context, now time.Time) {
	devices := s.snapshot()
	results := make([]measured, 0, len(devices))
	byGPU := map[string][]*trackedDevice{}
	for _, d := range devices {
		byGPU[d.gpu] = append(byGPU[d.gpu], d)
	}
	for gpu, ds := range byGPU {
		results = s.measureGPUGuarded(ctx, gpu, ds, results)
	}
	s.procs.endPass()
	s.dropGPM(devices)
	s.apply(now, results)
}

// snapshot lists the tracked devices.
func (s *Sampler) snapshot() []*trackedDevice {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*trackedDevice
	for _, c := range s.claims {
		for _, d := range c.devices {
			d.pods = c.pods
		}
		out = append(out, c.devices...)
	}
	return out
}

// apply judges the pass's samples and exports them, and tells Changed of
// the claims whose condition changed.
func (s *Sampler) apply(now time.Time, results []measured) {
	var changed []types.UID
	s.mu.Lock()
	for i := range results {
		m := &results[i]
		c := m.d.claim
		if s.claims[c.uid] != c {
			continue // forgotten meanwhile
		}
		threshold := int32(0)
		if s.opts.Thresholds != nil {
			threshold = s.opts.Thresholds.Threshold(c.namespace, m.d.profile)
		}
		ch, idle := m.d.judge.add(now, m.use, threshold)
		if ch {
			changed = append(changed, c.uid)
		}
		s.opts.Metrics.export(m, soloPod(c), idle)
	}
	s.mu.Unlock()
	if s.opts.Changed != nil {
		for _, uid := range changed {
			s.opts.Changed(uid)
		}
	}
}

// soloPod is the pod label of a claim's series: its pod's name if it has
// exactly one, else "" (one claim spanning pods).
func soloPod(c *tracked) string {
	if len(c.pods) != 1 {
		return ""
	}
	for _, name := range c.pods {
		return name
	}
	return ""
}

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
		st.have = false
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
