// Package mig models NVIDIA Multi-Instance GPU partitions for the driver:
// the GPU-instance profiles and placements a GPU reports, their KEP-4815
// partitionable-device form (counter sets and counter consumption), and the
// creation and destruction of GPU and compute instances at prepare time.
//
// Every NVML call goes through an nvml.Device so the same code runs on the
// real library and on go-nvml's mock machines (completed by migtest).
// Callers serialise calls that change one GPU's MIG state (Create, Destroy,
// EnableMigMode, DisableMigMode) with that GPU's lock.
package mig

import (
	"cmp"
	"errors"
	"fmt"
	"slices"

	"github.com/NVIDIA/go-nvlib/pkg/nvlib/device"
	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// ErrNotMigCapable is returned for a GPU that has no MIG support.
var ErrNotMigCapable = errors.New("GPU is not MIG-capable")

// Profile is one MIG device shape of a GPU: a GPU-instance profile and the
// compute-instance profile created inside it, as NVML reports them.
type Profile struct {
	// Name is NVIDIA's name, from go-nvlib: "1g.10gb", "1g.10gb+me",
	// "1c.3g.40gb".
	Name string
	// GIProfileID, CIProfileID and CIEngProfileID are NVML profile indexes
	// (nvml.GPU_INSTANCE_PROFILE_*, nvml.COMPUTE_INSTANCE_PROFILE_*).
	GIProfileID, CIProfileID, CIEngProfileID int
	// ComputeSlices is what the GPU instance reserves (the "3g" of
	// "1c.3g.40gb"); the counters charge this.
	ComputeSlices int
	// CIComputeSlices is the compute instance's share (the "1c").
	CIComputeSlices int
	// ComputeVariant marks a compute instance smaller than its GPU
	// instance. Such profiles are listed for static MIG but never offered
	// as dynamic devices: the rest of the GPU instance would be stranded.
	ComputeVariant bool
	// MemorySlices is the size of every placement, in memory slices.
	MemorySlices int
	// MaxInstances is how many of this profile fit on the GPU at once.
	MaxInstances int
	MemoryBytes  uint64
	// Multiprocessors is exact for full profiles; for a compute variant it
	// is the GPU instance's share by slices, as NVML answers CI profile
	// queries only for an existing GPU instance.
	Multiprocessors int
	CopyEngines     int
	Decoders        int
	Encoders        int
	JpegEngines     int
	OfaEngines      int
	// Placements are the memory-slice ranges NVML allows, ascending.
	Placements []Placement
}

// Placement is a GPU instance's position: memory slices [Start, Start+Size).
type Placement struct {
	Start int `json:"start"`
	Size  int `json:"size"`
}

// End is one past the last memory slice of the placement.
func (p Placement) End() int { return p.Start + p.Size }

// Overlaps tells whether two placements share a memory slice.
func (p Placement) Overlaps(o Placement) bool { return p.Start < o.End() && o.Start < p.End() }

// devlib only names profiles and visits them on an nvml.Device; it never
// calls the library itself, so it needs no nvml.Interface. Symbols are not
// verified here because nvdev already checked MIG support with go-nvlib.
var devlib = device.New(nil, device.WithVerifySymbols(false))

// Profiles returns every MIG profile the GPU supports, including "+me"
// media-extension profiles and compute-instance variants (flagged), in a
// stable order: full profiles by compute slices then memory, variants last.
func Profiles(dev nvml.Device) ([]Profile, error) {
	if _, _, ret := dev.GetMigMode(); ret == nvml.ERROR_NOT_SUPPORTED {
		return nil, ErrNotMigCapable
	}
	d, err := devlib.NewDevice(dev)
	if err != nil {
		return nil, fmt.Errorf("wrapping GPU handle: %w", err)
	}
	gis := map[int]giProfile{}
	var out []Profile
	seen := map[string]bool{}
	err = d.VisitMigProfiles(func(mp device.MigProfile) error {
		name := mp.String()
		// go-nvlib visits equivalent CI profile revisions under one name;
		// the first (lowest CI profile index) is the canonical one.
		if seen[name] {
			return nil
		}
		seen[name] = true
		gi, err := lookupGI(dev, gis, mp.GetInfo().GIProfileID)
		if err != nil {
			return err
		}
		out = append(out, newProfile(name, mp.GetInfo(), gi))
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("listing MIG profiles: %w", err)
	}
	if len(out) == 0 {
		return nil, errors.New("NVML reported no MIG profiles for a MIG-capable GPU")
	}
	slices.SortStableFunc(out, compareProfiles)
	return out, nil
}

// giProfile is what NVML says of one GPU-instance profile.
type giProfile struct {
	info       nvml.GpuInstanceProfileInfo
	placements []Placement
}

func lookupGI(dev nvml.Device, cache map[int]giProfile, id int) (giProfile, error) {
	if gi, ok := cache[id]; ok {
		return gi, nil
	}
	info, ret := dev.GetGpuInstanceProfileInfo(id)
	if ret != nvml.SUCCESS {
		return giProfile{}, fmt.Errorf("getting GPU instance profile %d: %w", id, ret)
	}
	raw, ret := dev.GetGpuInstancePossiblePlacements(&info)
	if ret != nvml.SUCCESS {
		return giProfile{}, fmt.Errorf("getting placements of GPU instance profile %d: %w", id, ret)
	}
	gi := giProfile{info: info, placements: make([]Placement, 0, len(raw))}
	for _, p := range raw {
		gi.placements = append(gi.placements, Placement{Start: int(p.Start), Size: int(p.Size)})
	}
	slices.SortFunc(gi.placements, func(a, b Placement) int { return cmp.Compare(a.Start, b.Start) })
	cache[id] = gi
	return gi, nil
}

func newProfile(name string, mi device.MigProfileInfo, gi giProfile) Profile {
	info := gi.info
	p := Profile{
		Name:            name,
		GIProfileID:     mi.GIProfileID,
		CIProfileID:     mi.CIProfileID,
		CIEngProfileID:  mi.CIEngProfileID,
		ComputeSlices:   mi.G,
		CIComputeSlices: mi.C,
		ComputeVariant:  mi.C < mi.G,
		MaxInstances:    int(info.InstanceCount),
		MemoryBytes:     info.MemorySizeMB << 20,
		Multiprocessors: int(info.MultiprocessorCount) * mi.C / max(mi.G, 1),
		CopyEngines:     int(info.CopyEngineCount),
		Decoders:        int(info.DecoderCount),
		Encoders:        int(info.EncoderCount),
		JpegEngines:     int(info.JpegCount),
		OfaEngines:      int(info.OfaCount),
		Placements:      gi.placements,
	}
	if len(gi.placements) > 0 {
		p.MemorySlices = gi.placements[0].Size
	}
	return p
}

func compareProfiles(a, b Profile) int {
	if a.ComputeVariant != b.ComputeVariant {
		if a.ComputeVariant {
			return 1
		}
		return -1
	}
	return cmp.Or(
		cmp.Compare(a.ComputeSlices, b.ComputeSlices),
		cmp.Compare(a.MemoryBytes, b.MemoryBytes),
		cmp.Compare(a.CIComputeSlices, b.CIComputeSlices),
		cmp.Compare(a.Name, b.Name),
	)
}

// ProfileByName finds a profile by NVIDIA's name.
func ProfileByName(profiles []Profile, name string) (Profile, bool) {
	i := slices.IndexFunc(profiles, func(p Profile) bool { return p.Name == name })
	if i < 0 {
		return Profile{}, false
	}
	return profiles[i], true
}

// GPUTotals is what the whole GPU has, in the units MIG profiles use.
type GPUTotals struct {
	ComputeSlices   int // 7 on A100 and H100
	MemorySlices    int // 8 on A100 and H100
	MemoryBytes     uint64
	Multiprocessors int
	CopyEngines     int
	Decoders        int
	Encoders        int
	JpegEngines     int
	OfaEngines      int
	// InstanceLimits maps InstancesCounter names to the profile's
	// MaxInstances, for the profiles that need a cap.
	InstanceLimits map[string]int
}

// Totals derives the GPU's totals from its full profiles. Each amount is
// the largest that some profile proves exists: the full-GPU profile's own
// count, or a profile's count times how many of it fit at once (seven 1g
// instances need seven decoders). Using that lower bound never promises the
// scheduler an engine the GPU lacks, and keeps every single-profile packing
// schedulable even where a driver under-reports the full-GPU profile.
func Totals(profiles []Profile) GPUTotals {
	var t GPUTotals
	for _, p := range profiles {
		if p.ComputeVariant {
			continue
		}
		n := max(p.MaxInstances, 1)
		t.ComputeSlices = max(t.ComputeSlices, p.ComputeSlices*n)
		t.MemoryBytes = max(t.MemoryBytes, p.MemoryBytes*uint64(n))
		t.Multiprocessors = max(t.Multiprocessors, p.Multiprocessors*n)
		t.CopyEngines = max(t.CopyEngines, p.CopyEngines*n)
		t.Decoders = max(t.Decoders, p.Decoders*n)
		t.Encoders = max(t.Encoders, p.Encoders*n)
		t.JpegEngines = max(t.JpegEngines, p.JpegEngines*n)
		t.OfaEngines = max(t.OfaEngines, p.OfaEngines*n)
		for _, pl := range p.Placements {
			t.MemorySlices = max(t.MemorySlices, pl.End())
		}
		if instanceLimited(p) {
			if t.InstanceLimits == nil {
				t.InstanceLimits = map[string]int{}
			}
			t.InstanceLimits[InstancesCounter(p)] = p.MaxInstances
		}
	}
	return t
}
