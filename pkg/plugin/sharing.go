package plugin

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/cdi"
	"github.com/gpuaas/gpu-dra-driver/pkg/mps"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/checkpoint"
	"github.com/gpuaas/gpu-dra-driver/pkg/timeslice"
	"k8s.io/klog/v2"
)

// mpsReady bounds the wait for a new MPS daemon: a daemon pod is created,
// scheduled to this node by name and started by the kubelet. The wait runs
// inside the kubelet's NodePrepareResources call, which the kubelet gives
// up on after kubeletDRATimeout: a longer wait (it was 60 s) outlived the
// call, so the kubelet retried a prepare still running and the claim's
// error was never the daemon's. What is left of the call is for the rest
// of the prepare (MIG create, CDI write, checkpoint).
const mpsReady = 30 * time.Second

// kubeletDRATimeout is how long the kubelet waits for one DRA call
// (NodePrepareResources, NodeUnprepareResources) before it cancels it.
const kubeletDRATimeout = 45 * time.Second

// SharingOptions wire the GPU sharing settings.
type SharingOptions struct {
	// DriverRoot is where nvidia-smi and nvidia-cuda-mps-control are
	// looked up; empty means none is available.
	DriverRoot string
	// Runner runs them; nil means exec.
	Runner timeslice.Runner
	// MPSDir holds the MPS daemons' pipe and log directories.
	MPSDir string
	// NVML sets the compute mode for MPS.
	NVML nvdev.Interface
	// MPSLauncher runs the MPS daemons; nil runs them as background
	// processes (mps.ProcessLauncher).
	MPSLauncher mps.Launcher
	// MPSShm provides each MPS GPU's shared memory; nil: a directory.
	MPSShm mps.ShmMounter
}

// Sharing applies per-GPU sharing settings, reference counted across the
// claims on a GPU. It is the timeslice.Backend of its Managers.
type Sharing struct {
	smi  timeslice.SMI
	mps  *mps.Daemons
	nvml nvdev.Interface
	mu   sync.Mutex
	// mgrs holds one Manager per GPU, so that one GPU's holders can be
	// counted again from the checkpoint alone (see State.refresh).
	mgrs map[string]*timeslice.Manager
}

// NewSharing builds the sharing settings of a node.
func NewSharing(o SharingOptions) *Sharing {
	runner := o.Runner
	if runner == nil {
		runner = timeslice.ExecRunner{}
	}
	return &Sharing{
		smi:  timeslice.SMI{Runner: runner, DriverRoot: o.DriverRoot},
		mps:  &mps.Daemons{Runner: runner, DriverRoot: o.DriverRoot, Dir: o.MPSDir, Ready: mpsReady, Launcher: o.MPSLauncher, Shm: o.MPSShm},
		nvml: o.NVML,
		mgrs: map[string]*timeslice.Manager{},
	}
}

// mgr is the reference count of one GPU's settings.
func (s *Sharing) mgr(gpu string) *timeslice.Manager {
	s.mu.Lock()
	defer s.mu.Unlock()
	m, ok := s.mgrs[gpu]
	if !ok {
		m = timeslice.NewManager(s)
		s.mgrs[gpu] = m
	}
	return m
}

// forget drops what this process counted on a GPU, before its holders are
// adopted again from the checkpoint.
func (s *Sharing) forget(gpu string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.mgrs, gpu)
}

// holders returns the number of holders of a GPU and the settings in force.
func (s *Sharing) holders(gpu string) (int, timeslice.Settings) { return s.mgr(gpu).Holders(gpu) }

// Apply implements timeslice.Backend: Default-interval time-slicing is the
// GPU's own behaviour and needs no tool, but it needs the DEFAULT compute
// mode (see timeSliceComputeMode).
func (s *Sharing) Apply(ctx context.Context, gpu string, set timeslice.Settings) error {
	if set.Strategy == configapi.MPSStrategy {
		return s.startMPS(ctx, gpu)
	}
	if err := s.timeSliceComputeMode(ctx, gpu); err != nil {
		return err
	}
	if set.Interval.OrDefault() == configapi.DefaultTimeSlice {
		return nil
	}
	return s.smi.SetInterval(ctx, gpu, set.Interval)
}

// Ensure implements timeslice.Backend: an MPS GPU is put back in
// exclusive-process mode if something reset it, and a dead daemon is
// started again; a time-sliced GPU is put back in DEFAULT mode if
// something changed it.
func (s *Sharing) Ensure(ctx context.Context, gpu string, set timeslice.Settings) error {
	if set.Strategy != configapi.MPSStrategy {
		return s.timeSliceComputeMode(ctx, gpu)
	}
	if err := s.setComputeMode(gpu, nvml.COMPUTEMODE_EXCLUSIVE_PROCESS); err != nil {
		return err
	}
	return s.mps.Ensure(ctx, gpu)
}

// reconcile makes every GPU's settings what its holders were promised
// (after a plugin restart: a daemon that died with an old plugin, a mode
// reset under it) and stops the MPS daemons that no claim holds (left by a
// plugin killed between starting one and recording it, or by one whose
// reset failed). The caller holds every GPU.
func (s *Sharing) reconcile(ctx context.Context) error {
	var errs []error
	s.mu.Lock()
	held := map[string]*timeslice.Manager{}
	for gpu, m := range s.mgrs {
		held[gpu] = m
	}
	s.mu.Unlock()
	for gpu, m := range held {
		if n, set := m.Holders(gpu); n > 0 {
			errs = append(errs, s.Ensure(ctx, gpu, set))
		}
	}
	known, err := s.mps.Known()
	errs = append(errs, err)
	for _, gpu := range known {
		if n, set := s.holders(gpu); n == 0 || set.Strategy != configapi.MPSStrategy {
			klog.FromContext(ctx).Info("Stopping an MPS daemon that no claim holds", "gpu", gpu)
			errs = append(errs, s.Reset(ctx, gpu, timeslice.Settings{Strategy: configapi.MPSStrategy}))
		}
	}
	return errors.Join(errs...)
}

// Reset implements timeslice.Backend.
func (s *Sharing) Reset(ctx context.Context, gpu string, set timeslice.Settings) error {
	if set.Strategy == configapi.MPSStrategy {
		if err := s.mps.Stop(ctx, gpu); err != nil {
			return err
		}
		return s.setComputeMode(gpu, nvml.COMPUTEMODE_DEFAULT)
	}
	if set.Interval.OrDefault() == configapi.DefaultTimeSlice {
		return nil
	}
	return s.smi.SetInterval(ctx, gpu, configapi.DefaultTimeSlice)
}

// startMPS makes the GPU exclusive to the MPS server, then starts its
// daemon; a failure puts the compute mode back.
func (s *Sharing) startMPS(ctx context.Context, gpu string) error {
	if err := s.mps.Available(); err != nil {
		return err
	}
	if err := s.setComputeMode(gpu, nvml.COMPUTEMODE_EXCLUSIVE_PROCESS); err != nil {
		return err
	}
	if err := s.mps.Start(ctx, gpu); err != nil {
		return errors.Join(err, s.setComputeMode(gpu, nvml.COMPUTEMODE_DEFAULT))
	}
	return nil
}

// timeSliceComputeMode puts a time-sliced GPU in the DEFAULT compute
// mode. Time-slicing is many processes taking turns on one GPU; in
// EXCLUSIVE_PROCESS (left by an MPS daemon whose reset failed or was cut
// short, or set by an administrator) or PROHIBITED only one or no process
// may create a context, so every replica's container but the first fails
// with "all CUDA-capable devices are busy or unavailable". DEFAULT is the
// GPU's resting mode, so nothing needs it undone at reset. A Sharing built
// without NVML (tests of other parts; the plugin always has it) has no
// mode to set.
func (s *Sharing) timeSliceComputeMode(ctx context.Context, gpu string) error {
	if s.nvml == nil {
		return nil
	}
	dev, err := s.nvml.DeviceByUUID(gpu)
	if err != nil {
		return err
	}
	cur, getRet := dev.GetComputeMode()
	if getRet == nvml.SUCCESS && cur == nvml.COMPUTEMODE_DEFAULT {
		return nil
	}
	was := computeModeName(cur, getRet)
	switch ret := dev.SetComputeMode(nvml.COMPUTEMODE_DEFAULT); {
	case ret == nvml.SUCCESS:
	case ret == nvml.ERROR_NOT_SUPPORTED && getRet != nvml.SUCCESS:
		// A GPU that has no compute modes (some vGPU profiles) cannot
		// be in another one.
		klog.FromContext(ctx).V(1).Info("GPU has no compute modes; nothing to set for time-slicing", "gpu", gpu)
		return nil
	default:
		return fmt.Errorf("time-slicing needs GPU %s in the DEFAULT compute mode (now %s): setting it: %w", gpu, was, ret)
	}
	klog.FromContext(ctx).Info("Set the GPU's compute mode to DEFAULT for time-slicing", "gpu", gpu, "was", was)
	return nil
}

// computeModeName is a compute mode as nvidia-smi names it.
func computeModeName(mode nvml.ComputeMode, ret nvml.Return) string {
	if ret != nvml.SUCCESS {
		return "unknown: " + ret.Error()
	}
	switch mode {
	case nvml.COMPUTEMODE_DEFAULT:
		return "DEFAULT"
	case nvml.COMPUTEMODE_EXCLUSIVE_THREAD:
		return "EXCLUSIVE_THREAD"
	case nvml.COMPUTEMODE_PROHIBITED:
		return "PROHIBITED"
	case nvml.COMPUTEMODE_EXCLUSIVE_PROCESS:
		return "EXCLUSIVE_PROCESS"
	}
	return fmt.Sprintf("mode %d", mode)
}

// setComputeMode sets a GPU's compute mode, unless it is in it already
// (Ensure checks it before every new MPS client).
func (s *Sharing) setComputeMode(gpu string, mode nvml.ComputeMode) error {
	if s.nvml == nil {
		return errors.New("no NVML to set the compute mode with")
	}
	dev, err := s.nvml.DeviceByUUID(gpu)
	if err != nil {
		return err
	}
	if cur, ret := dev.GetComputeMode(); ret == nvml.SUCCESS && cur == mode {
		return nil
	}
	if ret := dev.SetComputeMode(mode); ret != nvml.SUCCESS {
		return fmt.Errorf("setting compute mode %d on %s: %w", mode, gpu, ret)
	}
	return nil
}

// sharingPlan is what one device of a claim needs of its GPU.
type sharingPlan struct {
	settings timeslice.Settings
	limits   *mps.Limits // MPS only
}

func (p *sharingPlan) settingsOrNil() *timeslice.Settings {
	if p == nil {
		return nil
	}
	s := p.settings
	return &s
}

func (p *sharingPlan) limitsOrNil() *mps.Limits {
	if p == nil || p.limits == nil {
		return nil
	}
	l := *p.limits
	return &l
}

// needsSharing reports whether preparing the plan may change a GPU's
// settings, which must be recorded before it happens. Default-interval
// time-slicing changes nothing, so it costs no extra checkpoint write.
func needsSharing(plan []plannedDevice) bool {
	for _, p := range plan {
		if p.sharing != nil && changesGPU(p.sharing.settings) {
			return true
		}
	}
	return false
}

func changesGPU(s timeslice.Settings) bool {
	return s.Strategy == configapi.MPSStrategy || s.Interval.OrDefault() != configapi.DefaultTimeSlice
}

// planSharing resolves a device's sharing to GPU settings and, for MPS,
// the client's limits. Every refusal names what to change.
func (s *State) planSharing(p plannedDevice) (*sharingPlan, error) {
	strategy := p.config.SharingStrategy()
	switch {
	case p.adminAccess():
		return nil, nil // monitoring never changes a GPU's settings
	case p.device.Type == TypeMIG && strategy != configapi.ExclusiveStrategy:
		return nil, fmt.Errorf("sharing strategy %s is not supported on MIG devices", strategy)
	case p.device.Type == TypeMIG, strategy == configapi.ExclusiveStrategy && p.device.Type == TypeGPU:
		return nil, nil
	case p.device.Sharing != nil:
		return planGPUSharing(p, *p.device.Sharing)
	case strategy == configapi.MPSStrategy:
		// A whole GPU is one claim's: its settings are the claim's.
		return planMPS(p)
	}
	return &sharingPlan{settings: timeslice.Settings{Strategy: strategy, Interval: claimInterval(p.config)}}, nil
}

// planGPUSharing plans a replica or share: the GPU's settings, which the
// claim's config may restate but not change (they are per GPU; see
// configapi.SharedMode), and for MPS the client's limits.
func planGPUSharing(p plannedDevice, gpu timeslice.Settings) (*sharingPlan, error) {
	if asked := sharingOf(p.config); asked != nil {
		switch {
		case asked.Strategy == configapi.ExclusiveStrategy:
			return nil, fmt.Errorf("a %s device shares its GPU by design; strategy %s cannot apply", p.device.Type, asked.Strategy)
		case asked.Strategy != "" && asked.Strategy != gpu.Strategy,
			gpu.Strategy == configapi.TimeSlicingStrategy && claimInterval(p.config) != "" && claimInterval(p.config) != gpu.Interval:
			wanted := timeslice.Settings{Strategy: cmp.Or(asked.Strategy, gpu.Strategy), Interval: claimInterval(p.config)}
			return nil, fmt.Errorf("GPU %d is shared with %s (node configuration); this claim's config asks for %s: "+
				"sharing settings are per GPU, select a GPU that has them (attributes %s, %s)",
				p.device.GPU.Index, gpu, wanted, timeslice.AttrSharingStrategy, timeslice.AttrTimeSliceInterval)
		}
	}
	if gpu.Strategy == configapi.MPSStrategy {
		return planMPS(p)
	}
	return &sharingPlan{settings: gpu}, nil
}

// claimInterval is the interval a claim's config names, "" for none.
func claimInterval(cfg configapi.Interface) configapi.TimeSliceInterval {
	if sh := sharingOf(cfg); sh != nil && sh.TimeSlicingConfig != nil {
		return sh.TimeSlicingConfig.Interval
	}
	return ""
}

// planMPS derives the limits from the device (its memory and that
// memory's share of the GPU), unless the config sets them.
func planMPS(p plannedDevice) (*sharingPlan, error) {
	if major, _, _ := strings.Cut(p.device.GPU.CUDAComputeCapability, "."); atoi(major) < 7 {
		return nil, fmt.Errorf("MPS with limits needs compute capability 7.0 or newer; GPU %s has %s",
			p.device.GPU.UUID, p.device.GPU.CUDAComputeCapability)
	}
	mem := deviceMemory(p)
	total := int64(p.device.GPU.MemoryBytes)
	limits := &mps.Limits{MemoryBytes: mem, ThreadPercentage: int(min(100, max(1, (mem*100+total-1)/total)))}
	if sh := sharingOf(p.config); sh != nil && sh.MpsConfig != nil {
		cfg := sh.MpsConfig
		if q := cfg.DefaultPinnedDeviceMemoryLimit; q != nil {
			if q.Value() > mem {
				return nil, fmt.Errorf("mpsConfig.defaultPinnedDeviceMemoryLimit %s exceeds the device's memory (%d bytes)", q.String(), mem)
			}
			limits.MemoryBytes = q.Value()
		}
		if t := cfg.DefaultActiveThreadPercentage; t != nil {
			limits.ThreadPercentage = *t
		}
	}
	return &sharingPlan{settings: timeslice.Settings{Strategy: configapi.MPSStrategy}, limits: limits}, nil
}

// deviceMemory is the memory a device stands for: the GPU's, a replica's
// part of it, or the share the scheduler recorded as consumed.
func deviceMemory(p plannedDevice) int64 {
	switch p.device.Type {
	case TypeTimeSlice:
		return int64(timeslice.ReplicaMemory(p.device.GPU.MemoryBytes, p.device.TimeSlicing.Replicas))
	case TypeShared:
		if q, ok := p.result.ConsumedCapacity["memory"]; ok {
			return q.Value()
		}
		if c, ok := p.device.API.Capacity["memory"]; ok && c.RequestPolicy != nil && c.RequestPolicy.Default != nil {
			return c.RequestPolicy.Default.Value()
		}
	}
	return int64(p.device.GPU.MemoryBytes)
}

func sharingOf(cfg configapi.Interface) *configapi.Sharing {
	switch c := cfg.(type) {
	case *configapi.GpuConfig:
		return c.Sharing
	case *configapi.MigConfig:
		return c.Sharing
	}
	return nil
}

func atoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}

// holder names one device of one claim in the reference counts.
func holder(claimUID, device string) string { return claimUID + "/" + device }

// acquireSharing applies each device's settings to its GPU, or joins the
// claims already holding them.
func (s *State) acquireSharing(ctx context.Context, plan []plannedDevice, rec *checkpoint.Claim) error {
	for _, p := range plan {
		if p.sharing == nil {
			continue
		}
		gpu := p.device.GPU.UUID
		if err := s.sharing.mgr(gpu).Acquire(ctx, gpu, holder(rec.UID, p.device.Name()), p.sharing.settings); err != nil {
			return err
		}
		if p.sharing.limits == nil {
			continue
		}
		// The daemon enforces what the client's environment only asks.
		n, _ := s.sharing.holders(gpu)
		if _, err := s.sharing.mps.Cover(ctx, gpu, *p.sharing.limits, n == 1); err != nil {
			return err
		}
	}
	return nil
}

// releaseSharing drops the claim's holds; a device whose release fails
// keeps its record, so unprepare is retried.
func (s *State) releaseSharing(ctx context.Context, rec *checkpoint.Claim) error {
	var errs []error
	for i := range rec.Devices {
		d := &rec.Devices[i]
		if d.Sharing == nil {
			continue
		}
		if err := s.sharing.mgr(d.GPUUUID).Release(ctx, d.GPUUUID, holder(rec.UID, d.Device)); err != nil {
			errs = append(errs, fmt.Errorf("releasing %s of %s: %w", d.Sharing, d.Device, err))
		}
	}
	return errors.Join(errs...)
}

// adoptSharing re-counts a recorded claim's holds (after a restart, or
// after another process changed them) on the GPUs for which on is true.
func (s *State) adoptSharing(rec *checkpoint.Claim, on func(gpu string) bool) error {
	var errs []error
	for _, d := range rec.Devices {
		if d.Sharing != nil && on(d.GPUUUID) {
			errs = append(errs, s.sharing.mgr(d.GPUUUID).Adopt(d.GPUUUID, holder(rec.UID, d.Device), *d.Sharing))
		}
	}
	return errors.Join(errs...)
}

func allGPUs(string) bool { return true }

// sharingEdits are what an MPS client container needs of its GPU's
// daemon: the environment with its limits, the pipe directory at the path
// the daemon listens on, and the shared memory at /dev/shm. Nothing for
// other devices.
func (s *State) sharingEdits(p plannedDevice) (map[string]string, []cdi.Mount) {
	if p.sharing == nil || p.sharing.limits == nil {
		return nil, nil
	}
	gpu := p.device.GPU.UUID
	pipe := s.sharing.mps.PipeDir(gpu)
	return s.sharing.mps.ClientEnv(gpu, *p.sharing.limits), []cdi.Mount{
		{HostPath: pipe, ContainerPath: pipe},
		{HostPath: s.sharing.mps.ShmDir(gpu), ContainerPath: mps.ShmContainerPath},
	}
}

// mpsOnOneGPUPerRequest refuses a request whose MPS devices are on
// several GPUs: the containers that use a request get all its devices, and
// a CUDA process reaches one MPS control daemon (CUDA_MPS_PIPE_DIRECTORY
// names one), so all but one GPU would be silently out of its reach.
// Requests of one claim may go to different containers, so only a request
// is checked.
func mpsOnOneGPUPerRequest(plan []plannedDevice) error {
	gpus := map[string]map[string]bool{}
	for _, p := range plan {
		if p.sharing == nil || p.sharing.limits == nil {
			continue
		}
		req := p.result.Request
		if gpus[req] == nil {
			gpus[req] = map[string]bool{}
		}
		gpus[req][p.device.GPU.UUID] = true
	}
	for req, set := range gpus {
		if len(set) > 1 {
			return fmt.Errorf("request %q has MPS devices on %d GPUs, but a container reaches one GPU's MPS daemon: "+
				"ask for MPS devices of one GPU per request (e.g. a matchAttribute constraint on %s/parentUUID or uuid), or one request per GPU",
				req, len(set), configapi.DriverName)
		}
	}
	return nil
}

// mpsDir is where the plugin keeps MPS pipes, next to its checkpoint.
func mpsDir(pluginDataDir string) string { return filepath.Join(pluginDataDir, "mps") }
