package mig

import (
	"cmp"
	"errors"
	"fmt"
	"slices"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// ErrReplaced is returned by Destroy when the instance is gone and its IDs
// now belong to a different instance. Nothing was destroyed; for the caller
// the instance no longer exists.
var ErrReplaced = errors.New("MIG instance was replaced by another")

// ErrLeftBehind marks a failed Create whose own rollback failed too: part
// of the MIG device may still exist at the placement. Any other failure of
// Create left nothing behind, so whatever is at the placement then is not
// the caller's (it may be why Create failed).
var ErrLeftBehind = errors.New("a failed MIG device creation left part of it behind")

// Instance is one MIG device: a GPU instance and its compute instance.
// It is what a checkpoint keeps to destroy exactly this device later.
type Instance struct {
	GIID int `json:"giID"`
	CIID int `json:"ciID"`
	// GIProfileID and CIProfileID are NVML profile indexes, as in Profile.
	GIProfileID int       `json:"giProfileID"`
	CIProfileID int       `json:"ciProfileID"`
	Profile     string    `json:"profile"`
	Placement   Placement `json:"placement"`
	// UUID is the MIG device's UUID ("MIG-..."), what CUDA and CDI name.
	UUID string `json:"uuid"`
}

// Create makes a MIG device of profile p at placement pl: the GPU instance,
// then a compute instance of the profile's CI shape in it. MIG mode must be
// enabled. On any failure it destroys what it created, so a failed prepare
// leaves the GPU as it found it.
func Create(dev nvml.Device, p Profile, pl Placement) (Instance, error) {
	info, ret := dev.GetGpuInstanceProfileInfo(p.GIProfileID)
	if ret != nvml.SUCCESS {
		return Instance{}, fmt.Errorf("getting GPU instance profile of %s: %w", p.Name, ret)
	}
	place := nvml.GpuInstancePlacement{Start: uint32(pl.Start), Size: uint32(pl.Size)}
	gi, ret := dev.CreateGpuInstanceWithPlacement(&info, &place)
	if ret != nvml.SUCCESS {
		return Instance{}, fmt.Errorf("creating %s GPU instance at memory slice %d: %w", p.Name, pl.Start, ret)
	}
	inst, err := createCompute(dev, gi, p)
	if err != nil {
		return Instance{}, errors.Join(err, rollbackGI(gi))
	}
	return inst, nil
}

// createCompute fills the new GPU instance; on failure the caller destroys
// the GPU instance, and this destroys the compute instance it made.
func createCompute(dev nvml.Device, gi nvml.GpuInstance, p Profile) (Instance, error) {
	giInfo, ret := gi.GetInfo()
	if ret != nvml.SUCCESS {
		return Instance{}, fmt.Errorf("getting new GPU instance info: %w", ret)
	}
	ciProfile, ret := gi.GetComputeInstanceProfileInfo(p.CIProfileID, p.CIEngProfileID)
	if ret != nvml.SUCCESS {
		return Instance{}, fmt.Errorf("getting compute instance profile of %s: %w", p.Name, ret)
	}
	ci, ret := gi.CreateComputeInstance(&ciProfile)
	if ret != nvml.SUCCESS {
		return Instance{}, fmt.Errorf("creating %s compute instance in GPU instance %d: %w", p.Name, giInfo.Id, ret)
	}
	inst, err := describe(dev, giInfo, ci, p)
	if err != nil {
		return Instance{}, errors.Join(err, rollbackCI(ci))
	}
	return inst, nil
}

func describe(dev nvml.Device, giInfo nvml.GpuInstanceInfo, ci nvml.ComputeInstance, p Profile) (Instance, error) {
	ciInfo, ret := ci.GetInfo()
	if ret != nvml.SUCCESS {
		return Instance{}, fmt.Errorf("getting new compute instance info: %w", ret)
	}
	inst := Instance{
		GIID:        int(giInfo.Id),
		CIID:        int(ciInfo.Id),
		GIProfileID: p.GIProfileID,
		CIProfileID: p.CIProfileID,
		Profile:     p.Name,
		Placement:   Placement{Start: int(giInfo.Placement.Start), Size: int(giInfo.Placement.Size)},
	}
	uuids, err := migUUIDs(dev)
	if err != nil {
		return Instance{}, err
	}
	var ok bool
	if inst.UUID, ok = uuids[[2]int{inst.GIID, inst.CIID}]; !ok {
		return Instance{}, fmt.Errorf("no MIG device found for GPU instance %d, compute instance %d", inst.GIID, inst.CIID)
	}
	return inst, nil
}

func rollbackGI(gi nvml.GpuInstance) error {
	if ret := gi.Destroy(); ret != nvml.SUCCESS {
		return fmt.Errorf("%w: rolling back: destroying GPU instance: %w", ErrLeftBehind, ret)
	}
	return nil
}

func rollbackCI(ci nvml.ComputeInstance) error {
	if ret := ci.Destroy(); ret != nvml.SUCCESS {
		return fmt.Errorf("%w: rolling back: destroying compute instance: %w", ErrLeftBehind, ret)
	}
	return nil
}

// migUUIDs maps (GI ID, CI ID) to the UUIDs of the GPU's MIG devices.
func migUUIDs(dev nvml.Device) (map[[2]int]string, error) {
	n, ret := dev.GetMaxMigDeviceCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("getting MIG device count: %w", ret)
	}
	out := make(map[[2]int]string, n)
	for i := range n {
		m, ret := dev.GetMigDeviceHandleByIndex(i)
		if ret == nvml.ERROR_NOT_FOUND || ret == nvml.ERROR_INVALID_ARGUMENT {
			continue // a free slot
		}
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("getting MIG device %d: %w", i, ret)
		}
		key, uuid, err := migIdentity(m)
		if err != nil {
			return nil, fmt.Errorf("reading MIG device %d: %w", i, err)
		}
		out[key] = uuid
	}
	return out, nil
}

func migIdentity(m nvml.Device) ([2]int, string, error) {
	gi, ret := m.GetGpuInstanceId()
	if ret != nvml.SUCCESS {
		return [2]int{}, "", fmt.Errorf("getting GPU instance ID: %w", ret)
	}
	ci, ret := m.GetComputeInstanceId()
	if ret != nvml.SUCCESS {
		return [2]int{}, "", fmt.Errorf("getting compute instance ID: %w", ret)
	}
	uuid, ret := m.GetUUID()
	if ret != nvml.SUCCESS {
		return [2]int{}, "", fmt.Errorf("getting UUID: %w", ret)
	}
	return [2]int{gi, ci}, uuid, nil
}

// Destroy removes exactly inst: its compute instance, then its GPU
// instance. An instance that is already gone is not an error, so unprepare
// can be retried. IDs that now name a different instance (other profile,
// placement or UUID) are left alone and reported with ErrReplaced.
func Destroy(dev nvml.Device, inst Instance) error {
	gi, ret := dev.GetGpuInstanceById(inst.GIID)
	switch {
	case ret == nvml.ERROR_NOT_FOUND:
		return nil
	case ret != nvml.SUCCESS && migDisabled(dev):
		return nil // no instance exists while MIG mode is off
	case ret != nvml.SUCCESS:
		return fmt.Errorf("getting GPU instance %d: %w", inst.GIID, ret)
	}
	if err := checkGI(dev, gi, inst); err != nil {
		return err
	}
	if err := destroyCI(dev, gi, inst); err != nil {
		return err
	}
	if ret := gi.Destroy(); ret != nvml.SUCCESS && ret != nvml.ERROR_NOT_FOUND {
		return fmt.Errorf("destroying GPU instance %d: %w", inst.GIID, ret)
	}
	return nil
}

// checkGI makes sure the GPU instance with inst's ID is still inst's.
func checkGI(dev nvml.Device, gi nvml.GpuInstance, inst Instance) error {
	info, ret := gi.GetInfo()
	if ret != nvml.SUCCESS {
		return fmt.Errorf("getting GPU instance %d info: %w", inst.GIID, ret)
	}
	want, ret := dev.GetGpuInstanceProfileInfo(inst.GIProfileID)
	if ret != nvml.SUCCESS {
		return fmt.Errorf("getting GPU instance profile of %s: %w", inst.Profile, ret)
	}
	if info.ProfileId != want.Id || int(info.Placement.Start) != inst.Placement.Start {
		return fmt.Errorf("%w: GPU instance %d is no longer %s at memory slice %d",
			ErrReplaced, inst.GIID, inst.Profile, inst.Placement.Start)
	}
	return nil
}

func destroyCI(dev nvml.Device, gi nvml.GpuInstance, inst Instance) error {
	ci, ret := gi.GetComputeInstanceById(inst.CIID)
	if ret == nvml.ERROR_NOT_FOUND {
		return nil // a half-done earlier Destroy: only the GPU instance is left
	}
	if ret != nvml.SUCCESS {
		return fmt.Errorf("getting compute instance %d of GPU instance %d: %w", inst.CIID, inst.GIID, ret)
	}
	if inst.UUID != "" {
		uuids, err := migUUIDs(dev)
		if err != nil {
			return err
		}
		if got := uuids[[2]int{inst.GIID, inst.CIID}]; got != inst.UUID {
			return fmt.Errorf("%w: MIG device %d/%d is %s, not %s", ErrReplaced, inst.GIID, inst.CIID, got, inst.UUID)
		}
	}
	if ret := ci.Destroy(); ret != nvml.SUCCESS && ret != nvml.ERROR_NOT_FOUND {
		return fmt.Errorf("destroying compute instance %d of GPU instance %d: %w", inst.CIID, inst.GIID, ret)
	}
	return nil
}

// List returns the GPU's existing MIG devices, ordered by GPU and compute
// instance ID: what static mode publishes and what startup reconciliation
// compares with the checkpoint. A GPU with MIG mode off has none.
func List(dev nvml.Device) ([]Instance, error) {
	mode, _, ret := dev.GetMigMode()
	if ret == nvml.ERROR_NOT_SUPPORTED || (ret == nvml.SUCCESS && mode != nvml.DEVICE_MIG_ENABLE) {
		return nil, nil
	}
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("getting MIG mode: %w", ret)
	}
	mem, ret := dev.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("getting memory info: %w", ret)
	}
	uuids, err := migUUIDs(dev)
	if err != nil {
		return nil, err
	}
	var out []Instance
	for id := range nvml.GPU_INSTANCE_PROFILE_COUNT {
		insts, err := listProfile(dev, id, mem.Total, uuids)
		if err != nil {
			return nil, err
		}
		out = append(out, insts...)
	}
	slices.SortStableFunc(out, func(a, b Instance) int { return cmp.Or(cmp.Compare(a.GIID, b.GIID), cmp.Compare(a.CIID, b.CIID)) })
	// Two CI profile indexes can name one NVML profile; keep each CI once.
	return slices.CompactFunc(out, func(a, b Instance) bool { return a.GIID == b.GIID && a.CIID == b.CIID }), nil
}

// profileGIs is a GPU-instance profile index's info and GPU instances; no
// instances where the GPU does not support the profile.
func profileGIs(dev nvml.Device, giProfile int) (nvml.GpuInstanceProfileInfo, []nvml.GpuInstance, error) {
	info, ret := dev.GetGpuInstanceProfileInfo(giProfile)
	if ret == nvml.ERROR_NOT_SUPPORTED || ret == nvml.ERROR_INVALID_ARGUMENT {
		return info, nil, nil
	}
	if ret != nvml.SUCCESS {
		return info, nil, fmt.Errorf("getting GPU instance profile %d: %w", giProfile, ret)
	}
	gis, ret := dev.GetGpuInstances(&info)
	if ret != nvml.SUCCESS {
		return info, nil, fmt.Errorf("getting GPU instances of profile %d: %w", giProfile, ret)
	}
	return info, gis, nil
}

// listProfile lists the instances of one GPU-instance profile index.
func listProfile(dev nvml.Device, giProfile int, memTotal uint64, uuids map[[2]int]string) ([]Instance, error) {
	info, gis, err := profileGIs(dev, giProfile)
	if err != nil {
		return nil, err
	}
	var out []Instance
	for _, gi := range gis {
		insts, err := listGI(gi, giProfile, info.MemorySizeMB, memTotal, uuids)
		if err != nil {
			return nil, err
		}
		out = append(out, insts...)
	}
	return out, nil
}

func listGI(gi nvml.GpuInstance, giProfile int, memMB, memTotal uint64, uuids map[[2]int]string) ([]Instance, error) {
	giInfo, ret := gi.GetInfo()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("getting GPU instance info: %w", ret)
	}
	var out []Instance
	for ciProfile := range nvml.COMPUTE_INSTANCE_PROFILE_COUNT {
		for eng := range nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_COUNT {
			ciInfo, ret := gi.GetComputeInstanceProfileInfo(ciProfile, eng)
			if ret == nvml.ERROR_NOT_SUPPORTED || ret == nvml.ERROR_INVALID_ARGUMENT {
				continue
			}
			if ret != nvml.SUCCESS {
				return nil, fmt.Errorf("getting compute instance profile %d of GPU instance %d: %w", ciProfile, giInfo.Id, ret)
			}
			cis, ret := gi.GetComputeInstances(&ciInfo)
			if ret != nvml.SUCCESS {
				return nil, fmt.Errorf("getting compute instances of GPU instance %d: %w", giInfo.Id, ret)
			}
			name, err := profileName(giProfile, ciProfile, eng, memMB, memTotal)
			if err != nil {
				return nil, err
			}
			for _, ci := range cis {
				inst, err := listed(giInfo, ci, giProfile, ciProfile, name, uuids)
				if err != nil {
					return nil, err
				}
				out = append(out, inst)
			}
		}
	}
	return out, nil
}

func listed(giInfo nvml.GpuInstanceInfo, ci nvml.ComputeInstance, giProfile, ciProfile int, name string, uuids map[[2]int]string) (Instance, error) {
	ciInfo, ret := ci.GetInfo()
	if ret != nvml.SUCCESS {
		return Instance{}, fmt.Errorf("getting compute instance info in GPU instance %d: %w", giInfo.Id, ret)
	}
	return Instance{
		GIID:        int(giInfo.Id),
		CIID:        int(ciInfo.Id),
		GIProfileID: giProfile,
		CIProfileID: ciProfile,
		Profile:     name,
		Placement:   Placement{Start: int(giInfo.Placement.Start), Size: int(giInfo.Placement.Size)},
		UUID:        uuids[[2]int{int(giInfo.Id), int(ciInfo.Id)}],
	}, nil
}

// profileName names a GI/CI profile pair the way Profiles does.
func profileName(giProfile, ciProfile, eng int, memMB, memTotal uint64) (string, error) {
	p, err := devlib.NewMigProfile(giProfile, ciProfile, eng, memMB, memTotal)
	if err != nil {
		return "", fmt.Errorf("naming MIG profile %d/%d: %w", giProfile, ciProfile, err)
	}
	return p.String(), nil
}
