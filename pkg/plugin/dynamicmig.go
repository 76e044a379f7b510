package plugin

import (
	"context"
	"errors"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/cdi"
	"github.com/gpuaas/gpu-dra-driver/pkg/health"
	"github.com/gpuaas/gpu-dra-driver/pkg/mig"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/checkpoint"
)

// dynamicMIG is a (profile, placement) of a dynamic-MIG GPU: prepare
// creates the MIG device (MIG mode enabled first where that needs no
// reset) and unprepare destroys it. Admin access creates nothing: it gets
// the MIG device another claim made (observedPartition).
//
// A mode switch is not final on real GPUs: one another process holds is
// refused for a while (retried, then a claim error naming the holder), one
// left pending a reset is put back (mig.ErrPendingReset), and one that
// takes effect may re-bind the GPU with a new minor number, so the GPU is
// asked again (requery) before its MIG device is made and its CDI spec
// written.
type dynamicMIG struct{ part *mig.Partition }

func (dynamicMIG) Type() DeviceType { return TypeMIG }

func (dynamicMIG) modeName() string { return string(configapi.MigDynamic) }

func (dynamicMIG) planSharing(p plannedDevice) (*sharingPlan, error) { return migSharing(p) }

func (dynamicMIG) changesGPU(plannedDevice) bool { return true }

func (dynamicMIG) setUp(ctx context.Context, s *State, p *plannedDevice, rec *checkpoint.Claim, i int) error {
	if p.adminAccess() {
		observed, err := s.observedPartition(p.device)
		if err != nil {
			return err
		}
		return s.observe(ctx, p, observed)
	}
	dev, err := s.switchMIGMode(ctx, p, mig.EnableMigMode, "preparing "+p.device.Name())
	if err != nil {
		return err
	}
	return s.createMIG(dev, *p, rec, i)
}

func (dynamicMIG) cdiDevice(s *State, p plannedDevice, d *checkpoint.Device) (cdi.Device, error) {
	if d.CreatedMIG == nil {
		return gpuCDIDevice(p), nil
	}
	return s.migCDIDevice(p, d.CreatedMIG)
}

// tearDown destroys the MIG device the record names. Until a retry
// succeeds the placement is tainted, so that no other claim is given a
// device that cannot be made.
func (dynamicMIG) tearDown(ctx context.Context, s *State, rec *checkpoint.Claim, i int) error {
	d := &rec.Devices[i]
	if d.CreatedMIG == nil && d.MIGIntent == nil {
		return nil
	}
	scope := cleanupScope(d)
	err := s.destroyMIG(d)
	s.faults.SetCleanupBlocked(ctx, d.GPUUUID, scope, err)
	if err != nil {
		return err
	}
	d.CreatedMIG, d.MIGIntent = nil, nil
	return nil
}

func (dynamicMIG) adopt(*State, string, *checkpoint.Device) error { return nil }

func (k dynamicMIG) migScope() *health.MIGScope {
	return &health.MIGScope{GIProfileID: k.part.Profile.GIProfileID, Placement: k.part.Placement}
}

// dynamicWholeGPU is the whole GPU of a dynamic-MIG GPU whose MIG mode
// switches without a reset (Hopper and newer): prepare switches MIG mode
// off, then it is a whole GPU. Admin access switches nothing.
type dynamicWholeGPU struct{ wholeGPU }

func (dynamicWholeGPU) modeName() string { return string(configapi.MigDynamic) }

func (dynamicWholeGPU) changesGPU(plannedDevice) bool { return true }

func (k dynamicWholeGPU) setUp(ctx context.Context, s *State, p *plannedDevice, rec *checkpoint.Claim, i int) error {
	if p.adminAccess() {
		// The claim that switched MIG off may have re-bound the GPU in the
		// other plugin instance of a rolling update.
		return s.observe(ctx, p, p.device)
	}
	if _, err := s.switchMIGMode(ctx, p, mig.DisableMigMode, "preparing whole GPU "+p.device.Name()); err != nil {
		return err
	}
	return k.wholeGPU.setUp(ctx, s, p, rec, i)
}

// switchMIGMode sets the MIG mode of p's GPU, waiting for a GPU another
// process holds, and makes p's device the GPU as it is after the change.
func (s *State) switchMIGMode(ctx context.Context, p *plannedDevice, change func(nvml.Device) error, what string) (nvml.Device, error) {
	// On a handle asked for again if the cached one is stale: the GPU may
	// have been re-bound by the other plugin instance of a rolling update.
	_, err := nvdev.WithHandle(s.nvml, p.device.GPU.UUID, func(dev nvml.Device) error {
		return mig.RetryInUse(ctx, dev, s.modeRetry(), change)
	})
	if err != nil {
		return nil, fmt.Errorf("%s (GPU %d): %w", what, p.device.GPU.Index, err)
	}
	dev, now, err := s.requery(ctx, p.device)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	p.device = now
	return dev, nil
}

// observe makes p's device what admin access observes, on its GPU as it
// is now: the claim that made it may have re-bound the GPU in the other
// plugin instance of a rolling update.
func (s *State) observe(ctx context.Context, p *plannedDevice, observed *AllocatableDevice) error {
	_, now, err := s.requery(ctx, observed)
	if err != nil {
		return err
	}
	p.device = now
	return nil
}

// modeRetry is how this State's MIG mode changes wait for a GPU another
// process holds, naming the holders through NVML.
func (s *State) modeRetry() mig.InUseRetry {
	r := s.inUseRetry
	if r.First == 0 {
		r = mig.DefaultInUseRetry
	}
	if r.ProcessName == nil {
		r.ProcessName = s.nvml.NVML().SystemGetProcessName
	}
	return r
}

// createMIG creates the MIG device of the plan's partition for device i of
// rec. The intent (profile, placement) is recorded first: a process killed
// inside Create, or before the device is recorded, leaves a record that
// says where to look, and the undo (rollback, retry or Restore) destroys
// what is there. Once created, the device is recorded by identity.
func (s *State) createMIG(dev nvml.Device, p plannedDevice, rec *checkpoint.Claim, i int) error {
	part, d := p.device.Partition(), &rec.Devices[i]
	intent := mig.IntentOf(part.Profile, part.Placement)
	d.MIGIntent = &intent
	// Staged, not saved durably: the MIG device it announces does not
	// outlive a power loss either (checkpoint.Store.Stage).
	if err := s.store.Stage(rec); err != nil {
		d.MIGIntent = nil // nothing was created
		return fmt.Errorf("recording the intent to create MIG device %s: %w", p.device.Name(), err)
	}
	inst, err := mig.Create(dev, part.Profile, part.Placement)
	if err != nil {
		err = fmt.Errorf("creating MIG device %s: %w", p.device.Name(), err)
		if errors.Is(err, mig.ErrLeftBehind) {
			return err // the intent stays: the undo destroys what is left
		}
		// Create undid what it made. What is at the placement now may be
		// why it failed (someone else's); the intent must not name it.
		d.MIGIntent = nil
		return errors.Join(err, s.store.Stage(rec))
	}
	d.CreatedMIG = &inst
	// Recorded at once: from here on the undo destroys exactly this device.
	return s.store.Stage(rec)
}

// destroyMIG destroys the MIG device a record names: exactly the one it
// created or, where the prepare was cut short before recording that one,
// whatever is at the placement it meant to create one at (the scheduler
// gave that placement to this claim alone).
//
// On a GPU that fell off the bus there is nothing to destroy: its MIG
// devices do not outlive the reset or re-attach that brings it back (and
// one that did would be found unowned at the next start, unowned.go).
// Refusing would leave the claim prepared for ever and its pod stuck
// Terminating, as it did when a lost GPU took the plugin down.
//
// A GPU is taken for lost only if a handle asked for again says so too: a
// stale handle of a re-bound GPU answers GPU_IS_LOST as well, and taking
// it at its word would leave the MIG device behind.
func (s *State) destroyMIG(d *checkpoint.Device) error {
	_, err := nvdev.WithHandle(s.nvml, d.GPUUUID, func(dev nvml.Device) error { return destroyMIGOn(dev, d) })
	if errors.Is(err, nvml.ERROR_GPU_IS_LOST) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("destroying MIG device of %s: %w", d.Device, err)
	}
	return nil
}

// destroyMIGOn destroys what a record says a prepare made, or may have
// made, on the GPU dev.
func destroyMIGOn(dev nvml.Device, d *checkpoint.Device) error {
	if d.CreatedMIG != nil {
		if err := mig.Destroy(dev, *d.CreatedMIG); err != nil && !errors.Is(err, mig.ErrReplaced) {
			return fmt.Errorf("%s: %w", d.CreatedMIG.UUID, err)
		}
		return nil
	}
	if err := mig.DestroyAt(dev, *d.MIGIntent); err != nil {
		return fmt.Errorf("what an interrupted prepare left: %w", err)
	}
	return nil
}

// observedPartition is what admin access to a dynamic MIG partition gets:
// the MIG device another claim created at the partition's placement, as if
// it were static (this claim created nothing, so its unprepare destroys
// nothing).
//
// Admin access never creates the MIG device. The scheduler does not count
// admin-access allocations against the GPU's counters, so one created here
// would hold memory slices the scheduler hands to the next claim, whose
// prepare would then fail. (NVIDIA's DRA driver creates it whatever the
// access; with counters in play we do not.) Nor does it get the parent GPU
// instead, as it did: with MIG mode off that is the whole GPU, more than the
// partition it was allocated. What a MIG device needs of its parent, the
// parent's /dev/nvidiaN, comes with the MIG device's capability nodes.
func (s *State) observedPartition(d *AllocatableDevice) (*AllocatableDevice, error) {
	dev, err := s.nvml.DeviceByUUID(d.GPU.UUID)
	if err != nil {
		return nil, err
	}
	insts, err := mig.List(dev)
	if err != nil {
		return nil, fmt.Errorf("admin access to %s: listing MIG devices: %w", d.Name(), err)
	}
	part := d.Partition()
	for _, inst := range insts {
		if inst.Placement == part.Placement && inst.GIProfileID == part.Profile.GIProfileID {
			observed := *d
			observed.kind = staticMIG{inst: &inst}
			return &observed, nil
		}
	}
	return nil, fmt.Errorf("admin access to %s: no MIG device exists at its placement (%s at memory slice %d); admin access observes the MIG devices other claims prepared and never creates one",
		d.Name(), part.Profile.Name, part.Placement.Start)
}
