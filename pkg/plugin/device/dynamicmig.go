package device

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
	"k8s.io/klog/v2"
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

func (dynamicMIG) ModeName() string { return string(configapi.MigDynamic) }

func (dynamicMIG) PlanSharing(p Planned) (*sharingPlan, error) { return migSharing(p) }

func (dynamicMIG) ChangesGPU(Planned) bool { return true }

func (dynamicMIG) SetUp(ctx context.Context, e *Env, p *Planned, rec *checkpoint.Claim, i int) error {
	if p.AdminAccess() {
		observed, err := e.observedPartition(p.Device)
		if err != nil {
			return err
		}
		return e.observe(ctx, p, observed)
	}
	dev, err := e.switchMIGMode(ctx, p, mig.EnableMigMode, "preparing "+p.Device.Name())
	if err != nil {
		return err
	}
	if p.Rebuild {
		adopted, err := e.adoptMIG(ctx, dev, *p, rec, i)
		if adopted || err != nil {
			return err
		}
	}
	return e.createMIG(dev, *p, rec, i)
}

// adoptMIG records, for a claim whose record is rebuilt, the MIG device
// already at its placement: the one its earlier prepare made, which its
// container may be running on (the scheduler gave the placement to this
// claim alone). Creating another there fails, and the claim would lose
// its CDI spec and leave that device unowned.
func (e *Env) adoptMIG(ctx context.Context, dev nvml.Device, p Planned, rec *checkpoint.Claim, i int) (bool, error) {
	part := p.Device.Partition()
	insts, err := mig.List(dev)
	if err != nil {
		return false, fmt.Errorf("rebuilding %s: listing MIG devices: %w", p.Device.Name(), err)
	}
	for _, inst := range insts {
		if inst.Profile != part.Profile.Name || inst.Placement != part.Placement {
			continue
		}
		klog.FromContext(ctx).Info("Rebuilt claim keeps the MIG device at its placement", "device", p.Device.Name(), "migDevice", inst.UUID)
		rec.Devices[i].CreatedMIG = &inst
		if err := e.Store.Stage(rec); err != nil {
			return true, fmt.Errorf("recording MIG device %s of %s: %w", inst.UUID, p.Device.Name(), err)
		}
		return true, nil
	}
	return false, nil
}

func (dynamicMIG) CDIDevice(e *Env, p Planned, d *checkpoint.Device) (cdi.Device, error) {
	if d.CreatedMIG == nil {
		return gpuCDIDevice(p), nil
	}
	return e.migCDIDevice(p, d.CreatedMIG)
}

// TearDown destroys the MIG device the record names. Until a retry
// succeeds the placement is tainted, so that no other claim is given a
// device that cannot be made.
func (dynamicMIG) TearDown(ctx context.Context, e *Env, rec *checkpoint.Claim, i int) error {
	d := &rec.Devices[i]
	if d.CreatedMIG == nil && d.MIGIntent == nil {
		return nil
	}
	scope := cleanupScope(d)
	err := e.destroyMIG(d)
	e.Faults.SetCleanupBlocked(ctx, d.GPUUUID, scope, err)
	if err != nil {
		return err
	}
	d.CreatedMIG, d.MIGIntent = nil, nil
	return nil
}

func (dynamicMIG) Adopt(*Env, string, *checkpoint.Device) error { return nil }

func (k dynamicMIG) MIGScope() *health.MIGScope {
	return &health.MIGScope{GIProfileID: k.part.Profile.GIProfileID, Placement: k.part.Placement}
}

// dynamicWholeGPU is the whole GPU of a dynamic-MIG GPU whose MIG mode
// switches without a reset (Hopper and newer): prepare switches MIG mode
// off, then it is a whole GPU. Admin access switches nothing.
type dynamicWholeGPU struct{ wholeGPU }

func (dynamicWholeGPU) ModeName() string { return string(configapi.MigDynamic) }

func (dynamicWholeGPU) ChangesGPU(Planned) bool { return true }

func (k dynamicWholeGPU) SetUp(ctx context.Context, e *Env, p *Planned, rec *checkpoint.Claim, i int) error {
	if p.AdminAccess() {
		// The claim that switched MIG off may have re-bound the GPU in the
		// other plugin instance of a rolling update.
		return e.observe(ctx, p, p.Device)
	}
	if _, err := e.switchMIGMode(ctx, p, mig.DisableMigMode, "preparing whole GPU "+p.Device.Name()); err != nil {
		return err
	}
	return k.wholeGPU.SetUp(ctx, e, p, rec, i)
}

// switchMIGMode sets the MIG mode of p's GPU, waiting for a GPU another
// process holds, and makes p's device the GPU as it is after the change.
func (e *Env) switchMIGMode(ctx context.Context, p *Planned, change func(nvml.Device) error, what string) (nvml.Device, error) {
	// On a handle asked for again if the cached one is stale: the GPU may
	// have been re-bound by the other plugin instance of a rolling update.
	_, err := nvdev.WithHandle(e.NVML, p.Device.GPU.UUID, func(dev nvml.Device) error {
		return mig.RetryInUse(ctx, dev, e.modeRetry(), change)
	})
	if err != nil {
		return nil, fmt.Errorf("%s (GPU %d): %w", what, p.Device.GPU.Index, err)
	}
	dev, now, err := e.requery(ctx, p.Device)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	p.Device = now
	return dev, nil
}

// observe makes p's device what admin access observes, on its GPU as it
// is now: the claim that made it may have re-bound the GPU in the other
// plugin instance of a rolling update.
func (e *Env) observe(ctx context.Context, p *Planned, observed *AllocatableDevice) error {
	_, now, err := e.requery(ctx, observed)
	if err != nil {
		return err
	}
	p.Device = now
	return nil
}

// modeRetry is how this State's MIG mode changes wait for a GPU another
// process holds, naming the holders through NVML.
func (e *Env) modeRetry() mig.InUseRetry {
	r := e.InUseRetry
	if r.First == 0 {
		r = mig.DefaultInUseRetry
	}
	if r.ProcessName == nil {
		r.ProcessName = e.NVML.NVML().SystemGetProcessName
	}
	return r
}

// createMIG creates the MIG device of the plan's partition for device i of
// rec. The intent (profile, placement) is recorded first: a process killed
// inside Create, or before the device is recorded, leaves a record that
// says where to look, and the undo (rollback, retry or Restore) destroys
// what is there. Once created, the device is recorded by identity.
func (e *Env) createMIG(dev nvml.Device, p Planned, rec *checkpoint.Claim, i int) error {
	part, d := p.Device.Partition(), &rec.Devices[i]
	intent := mig.IntentOf(part.Profile, part.Placement)
	d.MIGIntent = &intent
	// Staged, not saved durably: the MIG device it announces does not
	// outlive a power loss either (checkpoint.Store.Stage).
	if err := e.Store.Stage(rec); err != nil {
		d.MIGIntent = nil // nothing was created
		return fmt.Errorf("recording the intent to create MIG device %s: %w", p.Device.Name(), err)
	}
	inst, err := mig.Create(dev, part.Profile, part.Placement)
	if err != nil {
		err = fmt.Errorf("creating MIG device %s: %w", p.Device.Name(), err)
		if errors.Is(err, mig.ErrLeftBehind) {
			return err // the intent stays: the undo destroys what is left
		}
		// Create undid what it made. What is at the placement now may be
		// why it failed (someone else's); the intent must not name it.
		d.MIGIntent = nil
		return errors.Join(err, e.Store.Stage(rec))
	}
	d.CreatedMIG = &inst
	// Recorded at once: from here on the undo destroys exactly this device.
	return e.Store.Stage(rec)
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
func (e *Env) destroyMIG(d *checkpoint.Device) error {
	_, err := nvdev.WithHandle(e.NVML, d.GPUUUID, func(dev nvml.Device) error { return destroyMIGOn(dev, d) })
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
func (e *Env) observedPartition(d *AllocatableDevice) (*AllocatableDevice, error) {
	dev, err := e.NVML.DeviceByUUID(d.GPU.UUID)
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
			observed.Kind = staticMIG{inst: &inst}
			return &observed, nil
		}
	}
	return nil, fmt.Errorf("admin access to %s: no MIG device exists at its placement (%s at memory slice %d); admin access observes the MIG devices other claims prepared and never creates one",
		d.Name(), part.Profile.Name, part.Placement.Start)
}
