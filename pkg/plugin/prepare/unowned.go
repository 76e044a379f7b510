package prepare

import (
	"context"
	"fmt"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/inventory"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/telemetry"
	"maps"
	"slices"

	"github.com/gpuaas/gpu-dra-driver/pkg/mig"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/checkpoint"
	"k8s.io/klog/v2"
)

// migKey names a GPU instance by where it is: two GPU instances never
// share a placement, and unlike its IDs the placement is known before the
// instance is created.
type migKey struct {
	gpu       string
	giProfile int
	placement mig.Placement
}

// findUnownedMIG finds, on each dynamic-MIG GPU, the GPU instances that no
// record names (as created, or as about to be): an admin's, or left by
// something the checkpoint never saw. They are left alone, as they might be
// someone's, but logged, counted, and kept for Withhold, so that their
// placements are not offered: a claim given one would fail at every
// prepare. It holds every GPU, so that no prepare of the other instance of
// a rolling update is half-way.
func (s *State) findUnownedMIG(ctx context.Context) error {
	held, err := s.lockAll(ctx, "the start's look for unowned MIG devices")
	if err != nil {
		return err
	}
	defer held.unlock()
	records, _, err := s.env.Store.List()
	if err != nil {
		return fmt.Errorf("reading the checkpoint: %w", err)
	}
	owned := ownedMIG(records)
	s.unowned = map[string][]mig.GPUInstance{}
	for _, uuid := range s.dynamicGPUs() {
		gis, err := s.unownedOn(uuid, owned)
		if err != nil {
			// Unknown is not unowned: the GPU is offered as configured.
			klog.FromContext(ctx).Error(err, "Looking for MIG devices that no claim owns", "gpu", uuid)
			continue
		}
		s.unowned[uuid] = gis
		s.metrics.SetUnownedMIG(uuid, len(gis))
		logUnowned(ctx, uuid, gis)
		if len(gis) > 0 {
			s.events.Warn(telemetry.ReasonUnownedMIGDevices, "Restore",
				"GPU %s has %d MIG device(s) that no claim owns (left by a crash, or made by hand); their placements are not offered until they are destroyed (nvidia-smi mig -dci/-dgi) and the plugin restarted",
				uuid, len(gis))
		}
	}
	return nil
}

// ownedMIG are the GPU instances the records name.
func ownedMIG(records []*checkpoint.Claim) map[migKey]bool {
	owned := map[migKey]bool{}
	for _, rec := range records {
		for _, d := range rec.Devices {
			if m := d.CreatedMIG; m != nil {
				owned[migKey{d.GPUUUID, m.GIProfileID, m.Placement}] = true
			}
			if m := d.MIGIntent; m != nil {
				owned[migKey{d.GPUUUID, m.GIProfileID, m.Placement}] = true
			}
		}
	}
	return owned
}

// dynamicGPUs are the GPUs offered in dynamic MIG mode, sorted.
func (s *State) dynamicGPUs() []string {
	var out []string
	for _, d := range s.DeviceMap() {
		if d.OnDynamicMIG() {
			out = append(out, d.GPU.UUID)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// unownedOn lists a GPU's GPU instances, bare ones included, less the owned.
func (s *State) unownedOn(uuid string, owned map[migKey]bool) ([]mig.GPUInstance, error) {
	dev, err := s.env.NVML.DeviceByUUID(uuid)
	if err != nil {
		return nil, err
	}
	gis, err := mig.ListGPUInstances(dev)
	if err != nil {
		return nil, fmt.Errorf("listing GPU instances: %w", err)
	}
	return slices.DeleteFunc(gis, func(gi mig.GPUInstance) bool {
		return owned[migKey{uuid, gi.GIProfileID, gi.Placement}]
	}), nil
}

func logUnowned(ctx context.Context, gpu string, gis []mig.GPUInstance) {
	for _, gi := range gis {
		var devices []string
		for _, inst := range gi.Devices {
			devices = append(devices, inst.Profile+" "+inst.UUID)
		}
		klog.FromContext(ctx).Error(nil, "MIG device that no claim owns: leaving it alone, and not offering its placement",
			"gpu", gpu, "gpuInstance", gi.GIID, "placement", gi.Placement, "migDevices", devices)
	}
}

// Withhold returns the inventory less what the MIG devices that
// RestoreRecords found unowned occupy, and stops preparing the devices it
// leaves out. It runs once, last in Restore.
func (s *State) Withhold(inv inventory.Inventory) inventory.Inventory {
	out, dropped := inv.Withhold(s.unowned)
	if len(dropped) == 0 {
		return out
	}
	s.devMu.Lock()
	defer s.devMu.Unlock()
	next := maps.Clone(s.devices)
	for _, name := range dropped {
		delete(next, name)
	}
	s.devices = next
	return out
}
