package mig

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Intent is a MIG device about to be created: its profile and placement.
// A checkpoint records it before Create, because a process killed inside
// Create, or before it records the Instance that Create returns, leaves a
// GPU instance that only its placement identifies.
type Intent struct {
	Profile     string    `json:"profile"`
	GIProfileID int       `json:"giProfileID"`
	Placement   Placement `json:"placement"`
}

// IntentOf is the intent to create a MIG device of p at pl.
func IntentOf(p Profile, pl Placement) Intent {
	return Intent{Profile: p.Name, GIProfileID: p.GIProfileID, Placement: pl}
}

// GPUInstance is one GPU instance found on a GPU, with the MIG devices
// (compute instances) in it: none for one that a Create cut short left bare.
type GPUInstance struct {
	GIID        int
	GIProfileID int
	Placement   Placement
	Devices     []Instance
}

// DestroyAt destroys the GPU instance of the intent's profile at its
// placement, whatever compute instances it holds: what an interrupted
// Create of the intent may have left. Nothing there is not an error.
func DestroyAt(dev nvml.Device, in Intent) error {
	gi, err := findGI(dev, in)
	if err != nil || gi == nil {
		return err
	}
	if err := destroyAllCI(gi); err != nil {
		return fmt.Errorf("%s at memory slice %d: %w", in.Profile, in.Placement.Start, err)
	}
	if ret := gi.Destroy(); ret != nvml.SUCCESS && ret != nvml.ERROR_NOT_FOUND {
		return fmt.Errorf("destroying %s GPU instance at memory slice %d: %w", in.Profile, in.Placement.Start, ret)
	}
	return nil
}

// findGI returns the GPU instance of the intent's profile at its
// placement, nil if there is none.
func findGI(dev nvml.Device, in Intent) (nvml.GpuInstance, error) {
	if migDisabled(dev) {
		return nil, nil // no instance exists while MIG mode is off
	}
	info, ret := dev.GetGpuInstanceProfileInfo(in.GIProfileID)
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("getting GPU instance profile of %s: %w", in.Profile, ret)
	}
	gis, ret := dev.GetGpuInstances(&info)
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("getting %s GPU instances: %w", in.Profile, ret)
	}
	for _, gi := range gis {
		giInfo, ret := gi.GetInfo()
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("getting GPU instance info: %w", ret)
		}
		if placementOf(giInfo) == in.Placement {
			return gi, nil
		}
	}
	return nil, nil
}

// destroyAllCI destroys every compute instance of a GPU instance, so that
// the GPU instance itself can go.
func destroyAllCI(gi nvml.GpuInstance) error {
	return visitCIProfiles(gi, func(info nvml.ComputeInstanceProfileInfo) error {
		cis, ret := gi.GetComputeInstances(&info)
		if ret != nvml.SUCCESS {
			return fmt.Errorf("getting compute instances: %w", ret)
		}
		for _, ci := range cis {
			// Two CI profile indexes can name one profile: a second
			// visit finds the instance gone.
			if ret := ci.Destroy(); ret != nvml.SUCCESS && ret != nvml.ERROR_NOT_FOUND {
				return fmt.Errorf("destroying compute instance: %w", ret)
			}
		}
		return nil
	})
}

// visitCIProfiles calls f with each compute-instance profile the GPU
// instance supports.
func visitCIProfiles(gi nvml.GpuInstance, f func(nvml.ComputeInstanceProfileInfo) error) error {
	for ciProfile := range nvml.COMPUTE_INSTANCE_PROFILE_COUNT {
		for eng := range nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_COUNT {
			info, ret := gi.GetComputeInstanceProfileInfo(ciProfile, eng)
			if ret == nvml.ERROR_NOT_SUPPORTED || ret == nvml.ERROR_INVALID_ARGUMENT {
				continue
			}
			if ret != nvml.SUCCESS {
				return fmt.Errorf("getting compute instance profile %d: %w", ciProfile, ret)
			}
			if err := f(info); err != nil {
				return err
			}
		}
	}
	return nil
}

// ListGPUInstances returns the GPU's GPU instances, bare ones included,
// ordered by ID, each with its MIG devices as List finds them. A GPU with
// MIG mode off has none.
func ListGPUInstances(dev nvml.Device) ([]GPUInstance, error) {
	insts, err := List(dev)
	if err != nil || migDisabled(dev) {
		return nil, err
	}
	var out []GPUInstance
	for id := range nvml.GPU_INSTANCE_PROFILE_COUNT {
		gis, err := gpuInstancesOf(dev, id)
		if err != nil {
			return nil, err
		}
		out = append(out, gis...)
	}
	slices.SortFunc(out, func(a, b GPUInstance) int { return cmp.Compare(a.GIID, b.GIID) })
	for _, inst := range insts {
		i := slices.IndexFunc(out, func(gi GPUInstance) bool { return gi.GIID == inst.GIID })
		if i >= 0 {
			out[i].Devices = append(out[i].Devices, inst)
		}
	}
	return out, nil
}

// gpuInstancesOf lists the GPU instances of one GPU-instance profile index.
func gpuInstancesOf(dev nvml.Device, giProfile int) ([]GPUInstance, error) {
	_, gis, err := profileGIs(dev, giProfile)
	if err != nil {
		return nil, err
	}
	out := make([]GPUInstance, 0, len(gis))
	for _, gi := range gis {
		giInfo, ret := gi.GetInfo()
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("getting GPU instance info: %w", ret)
		}
		out = append(out, GPUInstance{GIID: int(giInfo.Id), GIProfileID: giProfile, Placement: placementOf(giInfo)})
	}
	return out, nil
}

func placementOf(info nvml.GpuInstanceInfo) Placement {
	return Placement{Start: int(info.Placement.Start), Size: int(info.Placement.Size)}
}
