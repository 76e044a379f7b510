package mig

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// ApplyLayout makes the MIG devices of profiles on a GPU whose MIG mode is
// enabled, as an admin does with mig-parted before offering it as static
// MIG: each profile, in the order given, at its first possible placement
// that the devices already there leave free. It stops at the first profile
// that does not fit, keeping what it made.
func ApplyLayout(dev nvml.Device, profiles []string) ([]Instance, error) {
	known, err := Profiles(dev)
	if err != nil {
		return nil, err
	}
	existing, err := List(dev)
	if err != nil {
		return nil, err
	}
	var used []Placement
	for _, inst := range existing {
		used = append(used, inst.Placement)
	}
	var made []Instance
	for _, name := range profiles {
		p, ok := ProfileByName(known, name)
		if !ok {
			return made, fmt.Errorf("unknown MIG profile %q on this GPU", name)
		}
		inst, err := createAtFirstFree(dev, p, used)
		if err != nil {
			return made, err
		}
		made = append(made, inst)
		used = append(used, inst.Placement)
	}
	return made, nil
}

// createAtFirstFree creates p at the first placement NVML offers that no
// used placement overlaps.
func createAtFirstFree(dev nvml.Device, p Profile, used []Placement) (Instance, error) {
	info, ret := dev.GetGpuInstanceProfileInfo(p.GIProfileID)
	if ret != nvml.SUCCESS {
		return Instance{}, fmt.Errorf("getting GPU instance profile of %s: %w", p.Name, ret)
	}
	placements, ret := dev.GetGpuInstancePossiblePlacements(&info)
	if ret != nvml.SUCCESS {
		return Instance{}, fmt.Errorf("listing placements of %s: %w", p.Name, ret)
	}
	for _, np := range placements {
		pl := Placement{Start: int(np.Start), Size: int(np.Size)}
		if overlapsAny(pl, used) {
			continue
		}
		return Create(dev, p, pl)
	}
	return Instance{}, fmt.Errorf("no free placement left for %s", p.Name)
}

func overlapsAny(pl Placement, used []Placement) bool {
	for _, u := range used {
		if pl.Overlaps(u) {
			return true
		}
	}
	return false
}
