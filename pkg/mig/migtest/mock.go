// Package migtest completes go-nvml's mock machines for MIG: it adds the
// calls the mock devices lack (MIG device handles and UUIDs, instance
// lookups by ID) and makes instance creation and destruction refuse what
// real NVML refuses, so code under test meets the same failures.
package migtest

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"github.com/google/uuid"
)

// CompleteMock completes every device of a go-nvml mock server. Call it
// once, after the server is built and before it is used. Afterwards, as on
// real NVML:
//   - GPU instances are created only with MIG mode on, at a placement the
//     profile allows, within its instance count and the GPU's compute
//     slices, and not overlapping another instance's memory slices;
//   - compute instances fit their GPU instance's compute slices;
//   - a GPU instance with compute instances cannot be destroyed, nor MIG
//     mode turned off while GPU instances exist;
//   - destroying an instance twice answers ERROR_NOT_FOUND;
//   - each MIG device has a handle (GetMigDeviceHandleByIndex) and a UUID
//     that DeviceGetHandleByUUID finds.
func CompleteMock(s *server.Server) {
	for _, d := range s.Devices {
		if dev, ok := d.(*server.Device); ok {
			completeDevice(dev)
		}
	}
	byUUID := s.DeviceGetHandleByUUIDFunc
	s.DeviceGetHandleByUUIDFunc = func(id string) (nvml.Device, nvml.Return) {
		if d, ret := byUUID(id); ret == nvml.SUCCESS {
			return d, ret
		}
		for _, d := range s.Devices {
			if m := findMigDevice(d.(*server.Device), id); m != nil {
				return m, nvml.SUCCESS
			}
		}
		return nil, nvml.ERROR_NOT_FOUND
	}
}

// h100GpuInstancePlacements are the GPU instance placements an H100 80GB
// reports (read through real NVML, driver 580.159.04, on a lent H100): 8
// memory slices, where go-nvml's mock (v0.13.4-0, gpus/h100.go) has 7, so
// that its 7g.80gb, 3g.40gb and 1g.20gb sat where no H100 puts them. The
// mock has the other profiles right.
var h100GpuInstancePlacements = map[int][]nvml.GpuInstancePlacement{
	nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2: {{Start: 0, Size: 2}, {Start: 2, Size: 2}, {Start: 4, Size: 2}, {Start: 6, Size: 2}},
	nvml.GPU_INSTANCE_PROFILE_3_SLICE:      {{Start: 0, Size: 4}, {Start: 4, Size: 4}},
	nvml.GPU_INSTANCE_PROFILE_7_SLICE:      {{Start: 0, Size: 8}},
}

// completeGeometry gives a mock H100 the placements of a real one. The
// mock's tables are go-nvml's package variables, shared by every device,
// so the device gets a copy.
func completeGeometry(d *server.Device) {
	if !strings.Contains(d.Config.Name, "H100") {
		return
	}
	placements := maps.Clone(d.Config.MIGProfiles.GpuInstancePlacements)
	for id, pls := range h100GpuInstancePlacements {
		placements[id] = slices.Clone(pls)
	}
	d.Config.MIGProfiles.GpuInstancePlacements = placements
}

func completeDevice(d *server.Device) {
	completeGeometry(d)
	// mu makes a check and the creation it allows one step.
	var mu sync.Mutex
	d.IsMigDeviceHandleFunc = func() (bool, nvml.Return) { return false, nvml.SUCCESS }
	d.GetGpuInstanceByIdFunc = func(id int) (nvml.GpuInstance, nvml.Return) { return gpuInstanceByID(d, id) }
	d.GetMaxMigDeviceCountFunc = func() (int, nvml.Return) { return maxMigDevices(d), nvml.SUCCESS }
	d.GetMigDeviceHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) { return migDeviceByIndex(d, i) }
	// No process runs on a mock GPU (what a MIG mode change refused as in
	// use names).
	d.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.SUCCESS }

	createAt := d.CreateGpuInstanceWithPlacementFunc
	d.CreateGpuInstanceWithPlacementFunc = func(info *nvml.GpuInstanceProfileInfo, pl *nvml.GpuInstancePlacement) (nvml.GpuInstance, nvml.Return) {
		mu.Lock()
		defer mu.Unlock()
		if ret := checkPlacement(d, info, *pl); ret != nvml.SUCCESS {
			return nil, ret
		}
		gi, ret := createAt(info, pl)
		if ret == nvml.SUCCESS {
			completeGpuInstance(d, gi.(*server.GpuInstance))
		}
		return gi, ret
	}
	// Without a placement, NVML picks a free one.
	d.CreateGpuInstanceFunc = func(info *nvml.GpuInstanceProfileInfo) (nvml.GpuInstance, nvml.Return) {
		for _, pl := range d.Config.MIGProfiles.GpuInstancePlacements[int(info.Id)] {
			if gi, ret := d.CreateGpuInstanceWithPlacementFunc(info, &pl); ret == nvml.SUCCESS {
				return gi, ret
			}
		}
		return nil, nvml.ERROR_INSUFFICIENT_RESOURCES
	}
	setMode := d.SetMigModeFunc
	d.SetMigModeFunc = func(mode int) (nvml.Return, nvml.Return) {
		if mode == nvml.DEVICE_MIG_DISABLE && len(gpuInstances(d)) > 0 {
			return nvml.ERROR_IN_USE, nvml.ERROR_IN_USE
		}
		return setMode(mode)
	}
}

// checkPlacement refuses a GPU instance real NVML would refuse.
func checkPlacement(d *server.Device, info *nvml.GpuInstanceProfileInfo, pl nvml.GpuInstancePlacement) nvml.Return {
	d.RLock()
	mode := d.MigMode
	d.RUnlock()
	if mode != nvml.DEVICE_MIG_ENABLE {
		return nvml.ERROR_NOT_SUPPORTED
	}
	profiles := d.Config.MIGProfiles
	if !slices.Contains(profiles.GpuInstancePlacements[int(info.Id)], pl) {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	sameProfile, slicesUsed := 0, int(info.SliceCount)
	for _, gi := range gpuInstances(d) {
		if overlaps(gi.Info.Placement, pl) {
			return nvml.ERROR_INSUFFICIENT_RESOURCES
		}
		if gi.Info.ProfileId == info.Id {
			sameProfile++
		}
		slicesUsed += int(profiles.GpuInstanceProfiles[int(gi.Info.ProfileId)].SliceCount)
	}
	if sameProfile >= int(info.InstanceCount) || slicesUsed > computeSlices(d) {
		return nvml.ERROR_INSUFFICIENT_RESOURCES
	}
	return nvml.SUCCESS
}

func overlaps(a, b nvml.GpuInstancePlacement) bool {
	return a.Start < b.Start+b.Size && b.Start < a.Start+a.Size
}

// computeSlices is the GPU's compute slice count: its largest profile's.
func computeSlices(d *server.Device) int {
	n := 0
	for _, p := range d.Config.MIGProfiles.GpuInstanceProfiles {
		n = max(n, int(p.SliceCount))
	}
	return n
}

func maxMigDevices(d *server.Device) int {
	n := 0
	for _, p := range d.Config.MIGProfiles.GpuInstanceProfiles {
		n = max(n, int(p.InstanceCount))
	}
	return n
}

// gpuInstances returns the device's GPU instances by ID.
func gpuInstances(d *server.Device) []*server.GpuInstance {
	d.RLock()
	defer d.RUnlock()
	out := make([]*server.GpuInstance, 0, len(d.GpuInstances))
	for gi := range d.GpuInstances {
		out = append(out, gi)
	}
	slices.SortFunc(out, func(a, b *server.GpuInstance) int { return cmp.Compare(a.Info.Id, b.Info.Id) })
	return out
}

func gpuInstanceByID(d *server.Device, id int) (nvml.GpuInstance, nvml.Return) {
	for _, gi := range gpuInstances(d) {
		if int(gi.Info.Id) == id {
			return gi, nvml.SUCCESS
		}
	}
	return nil, nvml.ERROR_NOT_FOUND
}

func completeGpuInstance(d *server.Device, gi *server.GpuInstance) {
	var mu sync.Mutex
	gi.GetComputeInstanceByIdFunc = func(id int) (nvml.ComputeInstance, nvml.Return) {
		for _, ci := range computeInstances(gi) {
			if int(ci.Info.Id) == id {
				return ci, nvml.SUCCESS
			}
		}
		return nil, nvml.ERROR_NOT_FOUND
	}
	create := gi.CreateComputeInstanceFunc
	gi.CreateComputeInstanceFunc = func(info *nvml.ComputeInstanceProfileInfo) (nvml.ComputeInstance, nvml.Return) {
		mu.Lock()
		defer mu.Unlock()
		if ciSlicesUsed(gi)+int(info.SliceCount) > int(giProfile(gi).SliceCount) {
			return nil, nvml.ERROR_INSUFFICIENT_RESOURCES
		}
		ci, ret := create(info)
		if ret == nvml.SUCCESS {
			completeComputeInstance(gi, ci.(*server.ComputeInstance))
		}
		return ci, ret
	}
	gi.DestroyFunc = func() nvml.Return {
		d.Lock()
		defer d.Unlock()
		if _, ok := d.GpuInstances[gi]; !ok {
			return nvml.ERROR_NOT_FOUND
		}
		if len(computeInstances(gi)) > 0 {
			return nvml.ERROR_IN_USE
		}
		delete(d.GpuInstances, gi)
		return nvml.SUCCESS
	}
}

func giProfile(gi *server.GpuInstance) nvml.GpuInstanceProfileInfo {
	return gi.MIGProfiles.GpuInstanceProfiles[int(gi.Info.ProfileId)]
}

func ciProfile(gi *server.GpuInstance, ci *server.ComputeInstance) nvml.ComputeInstanceProfileInfo {
	return gi.MIGProfiles.ComputeInstanceProfiles[int(gi.Info.ProfileId)][int(ci.Info.ProfileId)]
}

func ciSlicesUsed(gi *server.GpuInstance) int {
	n := 0
	for _, ci := range computeInstances(gi) {
		n += int(ciProfile(gi, ci).SliceCount)
	}
	return n
}

// computeInstances returns a GPU instance's compute instances by ID.
func computeInstances(gi *server.GpuInstance) []*server.ComputeInstance {
	gi.RLock()
	defer gi.RUnlock()
	out := make([]*server.ComputeInstance, 0, len(gi.ComputeInstances))
	for ci := range gi.ComputeInstances {
		out = append(out, ci)
	}
	slices.SortFunc(out, func(a, b *server.ComputeInstance) int { return cmp.Compare(a.Info.Id, b.Info.Id) })
	return out
}

func completeComputeInstance(gi *server.GpuInstance, ci *server.ComputeInstance) {
	ci.DestroyFunc = func() nvml.Return {
		gi.Lock()
		defer gi.Unlock()
		if _, ok := gi.ComputeInstances[ci]; !ok {
			return nvml.ERROR_NOT_FOUND
		}
		delete(gi.ComputeInstances, ci)
		return nvml.SUCCESS
	}
}

// migPair is one MIG device: a compute instance in its GPU instance.
type migPair struct {
	gi *server.GpuInstance
	ci *server.ComputeInstance
}

func migPairs(d *server.Device) []migPair {
	var out []migPair
	for _, gi := range gpuInstances(d) {
		for _, ci := range computeInstances(gi) {
			out = append(out, migPair{gi, ci})
		}
	}
	return out
}

func migDeviceByIndex(d *server.Device, i int) (nvml.Device, nvml.Return) {
	if i < 0 || i >= maxMigDevices(d) {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	pairs := migPairs(d)
	if i >= len(pairs) {
		return nil, nvml.ERROR_NOT_FOUND
	}
	return newMigDevice(d, pairs[i]), nvml.SUCCESS
}

func findMigDevice(d *server.Device, id string) nvml.Device {
	for _, p := range migPairs(d) {
		if migUUID(d, p) == id {
			return newMigDevice(d, p)
		}
	}
	return nil
}

// MigUUID is the UUID the completed mock gives a MIG device. It is derived
// from the parent's UUID and the instance IDs, which the mock never reuses,
// so it is stable for the life of the instance and unique.
func MigUUID(parentUUID string, giID, ciID int) string {
	return "MIG-" + uuid.NewSHA1(uuid.NameSpaceOID, fmt.Appendf(nil, "%s/gi%d/ci%d", parentUUID, giID, ciID)).String()
}

func migUUID(d *server.Device, p migPair) string {
	return MigUUID(d.UUID, int(p.gi.Info.Id), int(p.ci.Info.Id))
}

// newMigDevice is a MIG device handle answering what CDI generation,
// go-nvlib's MigDevice and the driver ask of one.
func newMigDevice(d *server.Device, p migPair) *mock.Device {
	id := migUUID(d, p)
	gip, cip := giProfile(p.gi), ciProfile(p.gi, p.ci)
	attrs := nvml.DeviceAttributes{
		MultiprocessorCount:       cip.MultiprocessorCount,
		SharedCopyEngineCount:     gip.CopyEngineCount,
		SharedDecoderCount:        gip.DecoderCount,
		SharedEncoderCount:        gip.EncoderCount,
		SharedJpegCount:           gip.JpegCount,
		SharedOfaCount:            gip.OfaCount,
		GpuInstanceSliceCount:     gip.SliceCount,
		ComputeInstanceSliceCount: cip.SliceCount,
		MemorySizeMB:              gip.MemorySizeMB,
	}
	mem := nvml.Memory{Total: gip.MemorySizeMB << 20, Free: gip.MemorySizeMB << 20}
	return &mock.Device{
		IsMigDeviceHandleFunc:                  func() (bool, nvml.Return) { return true, nvml.SUCCESS },
		GetUUIDFunc:                            func() (string, nvml.Return) { return id, nvml.SUCCESS },
		GetNameFunc:                            func() (string, nvml.Return) { return d.Config.Name, nvml.SUCCESS },
		GetGpuInstanceIdFunc:                   func() (int, nvml.Return) { return int(p.gi.Info.Id), nvml.SUCCESS },
		GetComputeInstanceIdFunc:               func() (int, nvml.Return) { return int(p.ci.Info.Id), nvml.SUCCESS },
		GetDeviceHandleFromMigDeviceHandleFunc: func() (nvml.Device, nvml.Return) { return d, nvml.SUCCESS },
		GetAttributesFunc:                      func() (nvml.DeviceAttributes, nvml.Return) { return attrs, nvml.SUCCESS },
		GetMemoryInfoFunc:                      func() (nvml.Memory, nvml.Return) { return mem, nvml.SUCCESS },
		GetMinorNumberFunc:                     func() (int, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED },
		GetMigModeFunc:                         func() (int, int, nvml.Return) { return 0, 0, nvml.ERROR_NOT_SUPPORTED },
		// nvml.h: "MIG handles are not supported" by the memory limits.
		SetMemoryLimits_v1Func: func(string, uint64, uint64) nvml.Return { return nvml.ERROR_NOT_SUPPORTED },
		GetMemoryLimits_v1Func: func(string) (nvml.MemoryLimits_v1, nvml.Return) {
			return nvml.MemoryLimits_v1{}, nvml.ERROR_NOT_SUPPORTED
		},
	}
}
