package device

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/mps"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
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

// Forget drops what this process counted on a GPU, before its holders are
// adopted again from the checkpoint.
func (s *Sharing) Forget(gpu string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.mgrs, gpu)
}

// Holders returns the number of holders of a GPU and the settings in force.
func (s *Sharing) Holders(gpu string) (int, timeslice.Settings) { return s.mgr(gpu).Holders(gpu) }

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
// Exclusive-process mode if something reset it, and a dead daemon is
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

// Reconcile makes every GPU's settings what its holders were promised
// (after a plugin restart: a daemon that died with an old plugin, a mode
// reset under it) and stops the MPS daemons that no claim holds (left by a
// plugin killed between starting one and recording it, or by one whose
// reset failed). The caller holds every GPU.
func (s *Sharing) Reconcile(ctx context.Context) error {
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
		if n, set := s.Holders(gpu); n == 0 || set.Strategy != configapi.MPSStrategy {
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

// startMPS makes the GPU Exclusive to the MPS server, then starts its
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
	was := ComputeModeName(cur, getRet)
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

// ComputeModeName is a compute mode as nvidia-smi names it.
func ComputeModeName(mode nvml.ComputeMode, ret nvml.Return) string {
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
