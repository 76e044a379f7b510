// Package inventory is what this node offers: the devices discovered on
// its GPUs in the modes the node configuration gives them, their
// attributes and counter sets, how they are laid out in ResourceSlices,
// and the inventory less what must not be offered (GPUs a device plugin
// hands out, placements unowned MIG devices hold, counters the cluster
// drops), with the taints of the GPUs' faults. It prepares nothing.
package inventory

import (
	"errors"
	"fmt"

	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/device"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/mig"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
	"github.com/gpuaas/gpu-dra-driver/pkg/timeslice"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/klog/v2"
)

// Inventory is everything the node offers: devices in preferred order,
// grouped by the slice they go in, and the GPUs' counter sets: a dynamic
// MIG GPU's (KEP-4815), or a unit-only one (GPU milliunits, for Kueue).
type Inventory struct {
	Devices     []device.AllocatableDevice
	CounterSets []resourceapi.CounterSet
	// units: devices consume their share of their GPU in GPU milliunits
	// (NodeConfig gpuUnitCounters).
	units bool
	// ownSlice marks devices that start a slice of their own: each dynamic
	// MIG GPU's devices are published together in one slice, but for the
	// deferred ones, which follow all others (DeferPlacements).
	ownSlice map[int]bool
	// layouts are the dynamic MIG GPUs' layouts, by GPU UUID.
	layouts map[string]*mig.Layout
	// countersBeside: each counter set is published in the slices of the
	// devices that consume it, as Kubernetes 1.34 requires (ForCluster).
	countersBeside bool
}

// Discover builds the inventory from the GPUs and the node configuration.
// A GPU whose mode cannot be honoured falls back to whole (or is skipped)
// with the reason logged; it never yields an invalid slice.
func Discover(logger klog.Logger, lib nvdev.Interface, cfg *configapi.NodeConfig) Inventory {
	inv := Inventory{ownSlice: map[int]bool{}, layouts: map[string]*mig.Layout{}, units: cfg.UnitCounters()}
	for _, gpu := range lib.GPUs() {
		mode := cfg.ModeFor(gpu.Index, gpu.UUID)
		log := logger.WithValues("gpu", gpu.UUID, "index", gpu.Index, "mig", mode.MIG)
		if err := inv.addGPU(lib, gpu, mode); err != nil {
			log.Error(err, "GPU not offered in its configured mode")
			if gpu.MigEnabled {
				continue // a GPU in MIG mode cannot be handed out whole
			}
			log.Info("Offering GPU whole instead")
			inv.addWhole(gpu, lib.System())
		}
	}
	return inv.DeferPlacements() // issue 29: see mig.Layout.Deferred
}

func (inv *Inventory) add(devs ...device.AllocatableDevice) {
	inv.Devices = append(inv.Devices, devs...)
}

// unitSet adds the unit-only counter set of a GPU offered whole, as
// replicas or as static MIG, and returns its name: the name a dynamic MIG
// GPU's set has, as a GPU is in one mode only. With unit counters off it
// adds nothing and returns "", for which mig.MilliunitsConsumption is nil.
func (inv *Inventory) unitSet(gpu nvdev.GPU) string {
	if !inv.units {
		return ""
	}
	name := mig.CounterSetName(gpu.Index)
	inv.CounterSets = append(inv.CounterSets, mig.UnitCounterSet(name))
	return name
}

// addWhole offers a GPU whole: one device, the whole GPU's milliunits.
func (inv *Inventory) addWhole(gpu nvdev.GPU, sys nvdev.SystemInfo) {
	d := device.WholeGPUDevice(gpu, sys)
	d.API.ConsumesCounters = mig.MilliunitsConsumption(inv.unitSet(gpu), mig.GPUMilliunits)
	inv.add(d)
}

func (inv *Inventory) addGPU(lib nvdev.Interface, gpu nvdev.GPU, mode configapi.GpuMode) error {
	switch mode.MIG {
	case configapi.MigStatic:
		return inv.addStatic(lib, gpu)
	case configapi.MigDynamic:
		return inv.addDynamic(lib, gpu, mode)
	}
	if gpu.MigEnabled {
		return errors.New("MIG mode is enabled but the node configuration offers the GPU whole or shared; set mig: static or dynamic")
	}
	if mode.TimeSlicing != nil {
		inv.addReplicas(lib, gpu, *mode.TimeSlicing)
		return nil
	}
	if mode.Shared != nil {
		return inv.addShared(lib, gpu, *mode.Shared)
	}
	inv.addWhole(gpu, lib.System())
	return nil
}

func parentOf(gpu nvdev.GPU, sys nvdev.SystemInfo) mig.Parent {
	return mig.Parent{Index: gpu.Index, UUID: gpu.UUID, Attributes: device.GPUAttributes(gpu, sys)}
}

// addStatic offers the MIG devices that exist; it never creates or destroys
// any: in static mode the admin owns the layout. Nothing is added unless
// every device is known, so a GPU that falls back adds no counter set.
func (inv *Inventory) addStatic(lib nvdev.Interface, gpu nvdev.GPU) error {
	dev, profiles, err := migProfiles(lib, gpu)
	if err != nil {
		return err
	}
	if !gpu.MigEnabled {
		return errors.New("static MIG: MIG mode is disabled on this GPU")
	}
	insts, err := mig.List(dev)
	if err != nil {
		return fmt.Errorf("listing MIG devices: %w", err)
	}
	ps := make([]mig.Profile, len(insts))
	for i := range insts {
		if insts[i].UUID == "" {
			// Its compute instance exists, its MIG device not yet: the
			// admin (mig-manager) is making it as we read. Published with
			// the rest at the next read, never without a UUID.
			return fmt.Errorf("MIG device of GPU instance %d, compute instance %d is being made (no UUID yet)", insts[i].GIID, insts[i].CIID)
		}
		p, ok := mig.ProfileByName(profiles, insts[i].Profile)
		if !ok {
			return fmt.Errorf("MIG device %s has unknown profile %q", insts[i].UUID, insts[i].Profile)
		}
		ps[i] = p
	}
	totals, set := mig.Totals(profiles), inv.unitSet(gpu)
	for i := range insts {
		inv.add(device.AllocatableDevice{GPU: gpu, Kind: device.StaticMIG(&insts[i]),
			API: mig.StaticDevice(parentOf(gpu, lib.System()), ps[i], insts[i], totals, set)})
	}
	return nil
}

// addDynamic offers every (profile, placement) plus the whole GPU, all
// consuming the GPU's counters, in a slice of their own.
func (inv *Inventory) addDynamic(lib nvdev.Interface, gpu nvdev.GPU, mode configapi.GpuMode) error {
	dev, profiles, err := migProfiles(lib, gpu)
	if err != nil {
		return err
	}
	toggles, err := mig.TogglesWithoutReset(dev)
	if err != nil {
		return err
	}
	if !toggles && !gpu.MigEnabled {
		return errors.New("dynamic MIG on this GPU needs MIG mode enabled by the admin (a mode change needs a GPU reset)")
	}
	if !toggles && !mode.MigModeEnabledByAdmin {
		return errors.New("dynamic MIG on this GPU: set migModeEnabledByAdmin to confirm MIG mode is managed by the admin")
	}
	layout, err := mig.BuildDynamic(parentOf(gpu, lib.System()), profiles, inv.units)
	if err != nil {
		return err
	}
	if err := layout.Offer(mode.MigProfiles); err != nil {
		return err
	}
	inv.ownSlice[len(inv.Devices)] = true
	inv.CounterSets = append(inv.CounterSets, layout.CounterSet)
	inv.layouts[gpu.UUID] = &layout
	if toggles {
		// Hopper and newer switch MIG off for a whole-GPU claim at once.
		whole := device.WholeGPUDevice(gpu, lib.System())
		whole.Kind = device.DynamicWholeGPU()
		whole.API.ConsumesCounters = layout.WholeGPU
		inv.add(whole)
	}
	for i := range layout.Partitions {
		part := &layout.Partitions[i]
		inv.add(device.AllocatableDevice{GPU: gpu, Kind: device.DynamicMIG(part), API: part.Device})
	}
	inv.ownSlice[len(inv.Devices)] = true // whatever follows starts anew
	return nil
}

func migProfiles(lib nvdev.Interface, gpu nvdev.GPU) (nvml.Device, []mig.Profile, error) {
	if !gpu.MigCapable {
		return nil, nil, mig.ErrNotMigCapable
	}
	dev, err := lib.DeviceByUUID(gpu.UUID)
	if err != nil {
		return nil, nil, err
	}
	profiles, err := mig.Profiles(dev)
	if err != nil {
		return nil, nil, fmt.Errorf("reading MIG profiles: %w", err)
	}
	return dev, profiles, nil
}

func sharingParent(gpu nvdev.GPU, sys nvdev.SystemInfo) timeslice.Parent {
	return timeslice.Parent{Index: gpu.Index, UUID: gpu.UUID, MemoryBytes: gpu.MemoryBytes, Attributes: device.GPUAttributes(gpu, sys)}
}

// addReplicas offers a time-sliced GPU as its N replicas, each 1/N of its
// milliunits, rounded down.
func (inv *Inventory) addReplicas(lib nvdev.Interface, gpu nvdev.GPU, mode configapi.TimeSlicingMode) {
	units := mig.MilliunitsConsumption(inv.unitSet(gpu), timeslice.ReplicaShare(mig.GPUMilliunits, mode.Replicas))
	for _, api := range timeslice.ReplicaDevices(sharingParent(gpu, lib.System()), mode, units) {
		inv.add(device.AllocatableDevice{GPU: gpu, API: api, Kind: device.ReplicaOf(mode)})
	}
}

// addShared offers a shared GPU as one multi-allocatable device. It
// consumes no GPU milliunits: a multi-allocatable device's counters are
// taken once, by whichever share is allocated first, whatever the share's
// size, so they cannot say what a claim holds; Kueue can charge such
// claims by the memory capacity they consume instead.
func (inv *Inventory) addShared(lib nvdev.Interface, gpu nvdev.GPU, mode configapi.SharedMode) error {
	parent := sharingParent(gpu, lib.System())
	if err := timeslice.ValidateShared(parent, mode); err != nil {
		return err
	}
	inv.add(device.AllocatableDevice{GPU: gpu, API: timeslice.SharedDevice(parent, mode), Kind: device.SharedGPU(mode)})
	return nil
}
