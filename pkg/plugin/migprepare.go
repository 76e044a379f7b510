package plugin

import (
	"context"
	"errors"
	"fmt"
	"io/fs"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/mig"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/checkpoint"
)

// needsSetUp reports whether preparing the plan changes a GPU (creates a MIG
// device or switches MIG mode), which must be recorded before it happens.
func needsSetUp(plan []plannedDevice) bool {
	for _, p := range plan {
		if p.device.Mode == configapi.MigDynamic {
			return true
		}
	}
	return false
}

// setUpAll prepares the GPUs of a plan: a dynamic MIG device is created
// (MIG mode enabled first where that needs no reset); a whole GPU offered
// in dynamic mode gets MIG mode switched off. Each MIG device is recorded
// in rec before and after it is created (see createMIG), so a later
// failure or a crash can tear it down. Admin access changes no GPU: it gets
// the MIG device already there.
//
// A mode switch is not final on real GPUs: one another process holds is
// refused for a while (retried, then a claim error naming the holder), one
// left pending a reset is put back (mig.ErrPendingReset), and one that
// takes effect may re-bind the GPU with a new minor number, so the GPU is
// asked again (requery) before its MIG device is made and its CDI spec
// written.
func (s *State) setUpAll(ctx context.Context, plan []plannedDevice, rec *checkpoint.Claim) error {
	for i, p := range plan {
		if p.device.Mode != configapi.MigDynamic {
			continue
		}
		if p.adminAccess() {
			observed, err := s.observedPartition(p.device)
			if err != nil {
				return err
			}
			// The claim that made the MIG device may have re-bound the GPU
			// in the other plugin instance of a rolling update.
			if _, observed, err = s.requery(ctx, observed); err != nil {
				return err
			}
			plan[i].device = observed
			continue
		}
		dev, err := s.nvml.DeviceByUUID(p.device.GPU.UUID)
		if err != nil {
			return err
		}
		change, what := mig.EnableMigMode, "preparing "+p.device.Name()
		if p.device.Partition == nil {
			change, what = mig.DisableMigMode, "preparing whole GPU "+p.device.Name()
		}
		if err := mig.RetryInUse(ctx, dev, s.modeRetry(), change); err != nil {
			return fmt.Errorf("%s (GPU %d): %w", what, p.device.GPU.Index, err)
		}
		if dev, plan[i].device, err = s.requery(ctx, p.device); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		if p.device.Partition == nil {
			continue
		}
		if err := s.createMIG(dev, plan[i], rec, i); err != nil {
			return err
		}
	}
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
	part, d := p.device.Partition, &rec.Devices[i]
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

// tearDown destroys the MIG devices the plugin created for a claim and
// releases its sharing settings.
func (s *State) tearDown(ctx context.Context, rec *checkpoint.Claim) error {
	errs := []error{s.releaseSharing(ctx, rec)}
	for i := range rec.Devices {
		d := &rec.Devices[i]
		if d.CreatedMIG == nil && d.MIGIntent == nil {
			continue
		}
		scope := cleanupScope(d)
		err := s.destroyMIG(d)
		// Until a retry succeeds the placement is tainted, so that no other
		// claim is given a device that cannot be made.
		s.faults.SetCleanupBlocked(ctx, d.GPUUUID, scope, err)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		d.CreatedMIG, d.MIGIntent = nil, nil
	}
	return errors.Join(errs...)
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
func (s *State) destroyMIG(d *checkpoint.Device) error {
	dev, err := s.nvml.DeviceByUUID(d.GPUUUID)
	if errors.Is(err, nvml.ERROR_GPU_IS_LOST) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("destroying MIG device of %s: %w", d.Device, err)
	}
	if d.CreatedMIG != nil {
		err := mig.Destroy(dev, *d.CreatedMIG)
		if errors.Is(err, nvml.ERROR_GPU_IS_LOST) {
			return nil
		}
		if err != nil && !errors.Is(err, mig.ErrReplaced) {
			return fmt.Errorf("destroying MIG device %s of %s: %w", d.CreatedMIG.UUID, d.Device, err)
		}
		return nil
	}
	if err := mig.DestroyAt(dev, *d.MIGIntent); err != nil && !errors.Is(err, nvml.ERROR_GPU_IS_LOST) {
		return fmt.Errorf("destroying what an interrupted prepare of %s left: %w", d.Device, err)
	}
	return nil
}

// observedPartition is what admin access to a dynamic MIG partition gets:
// the MIG device another claim created at the partition's placement, as if
// it were static (this claim created nothing, so its unprepare destroys
// nothing). A whole GPU offered in dynamic mode is returned as it is.
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
	if d.Partition == nil {
		return d, nil
	}
	dev, err := s.nvml.DeviceByUUID(d.GPU.UUID)
	if err != nil {
		return nil, err
	}
	insts, err := mig.List(dev)
	if err != nil {
		return nil, fmt.Errorf("admin access to %s: listing MIG devices: %w", d.Name(), err)
	}
	part := d.Partition
	for _, inst := range insts {
		if inst.Placement == part.Placement && inst.GIProfileID == part.Profile.GIProfileID {
			observed := *d
			observed.Static = &inst
			return &observed, nil
		}
	}
	return nil, fmt.Errorf("admin access to %s: no MIG device exists at its placement (%s at memory slice %d); admin access observes the MIG devices other claims prepared and never creates one",
		d.Name(), part.Profile.Name, part.Placement.Start)
}

// migInstance is the MIG device behind a planned device, if any.
func migInstance(p plannedDevice, d checkpoint.Device) *mig.Instance {
	if d.CreatedMIG != nil {
		return d.CreatedMIG
	}
	return p.device.Static
}

// capNodes returns the /dev/nvidia-caps nodes that grant access to a MIG
// device. Without the driver's minors file (simulated GPUs) there are none.
func (s *State) capNodes(gpuMinor int, inst *mig.Instance) ([]mig.CapNode, error) {
	nodes, err := mig.CapDeviceNodes(s.migCaps, gpuMinor, inst.GIID, inst.CIID)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("MIG capability nodes of %s: %w", inst.UUID, err)
	}
	return nodes, nil
}
