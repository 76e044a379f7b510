package mig

import (
	"fmt"
	"maps"
	"slices"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"
)

// TypeMig is the value of the `type` attribute of MIG devices.
const TypeMig = "mig"

// Attribute and capacity names MIG devices add to their GPU's.
const (
	AttrType               resourceapi.QualifiedName = "type"
	AttrUUID               resourceapi.QualifiedName = "uuid"
	AttrProfile            resourceapi.QualifiedName = "profile"
	AttrParentUUID         resourceapi.QualifiedName = "parentUUID"
	AttrComputeSlices      resourceapi.QualifiedName = "computeSlices"
	AttrTotalComputeSlices resourceapi.QualifiedName = "totalComputeSlices"
	AttrMemorySlices       resourceapi.QualifiedName = "memorySlices"

	CapMemory          resourceapi.QualifiedName = "memory"
	CapMultiprocessors resourceapi.QualifiedName = "multiprocessors"
	CapCopyEngines     resourceapi.QualifiedName = "copyEngines"
	CapDecoders        resourceapi.QualifiedName = "decoders"
	CapEncoders        resourceapi.QualifiedName = "encoders"
	CapJpegEngines     resourceapi.QualifiedName = "jpegEngines"
	CapOfaEngines      resourceapi.QualifiedName = "ofaEngines"
)

// Parent is what MIG devices inherit from their GPU.
type Parent struct {
	// Index is the GPU's NVML index; device names use it.
	Index int
	UUID  string
	// Attributes are the GPU's own device attributes. Each MIG device gets
	// a copy, with `type`, `uuid` and the MIG attributes replaced.
	Attributes map[resourceapi.QualifiedName]resourceapi.DeviceAttribute
}

// MigAttributes are the attributes a MIG device adds to its GPU's.
func MigAttributes(p Profile, totals GPUTotals, parentUUID string) map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
	attrs := make(map[resourceapi.QualifiedName]resourceapi.DeviceAttribute, 6)
	setMigAttributes(attrs, p, totals, parentUUID)
	return attrs
}

func setMigAttributes(attrs map[resourceapi.QualifiedName]resourceapi.DeviceAttribute, p Profile, totals GPUTotals, parentUUID string) {
	attrs[AttrType] = resourceapi.DeviceAttribute{StringValue: ptr.To(TypeMig)}
	attrs[AttrProfile] = resourceapi.DeviceAttribute{StringValue: ptr.To(p.Name)}
	attrs[AttrParentUUID] = resourceapi.DeviceAttribute{StringValue: ptr.To(parentUUID)}
	attrs[AttrComputeSlices] = resourceapi.DeviceAttribute{IntValue: ptr.To(int64(p.ComputeSlices))}
	attrs[AttrTotalComputeSlices] = resourceapi.DeviceAttribute{IntValue: ptr.To(int64(totals.ComputeSlices))}
	attrs[AttrMemorySlices] = resourceapi.DeviceAttribute{IntValue: ptr.To(int64(p.MemorySlices))}
}

// MigCapacity is a MIG device's capacity. Every engine is listed, zero
// included, so CEL selectors on any of them never fail on a missing key.
func MigCapacity(p Profile) map[resourceapi.QualifiedName]resourceapi.DeviceCapacity {
	return map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
		CapMemory:          {Value: *resource.NewQuantity(int64(p.MemoryBytes), resource.BinarySI)},
		CapMultiprocessors: capacity(p.Multiprocessors),
		CapCopyEngines:     capacity(p.CopyEngines),
		CapDecoders:        capacity(p.Decoders),
		CapEncoders:        capacity(p.Encoders),
		CapJpegEngines:     capacity(p.JpegEngines),
		CapOfaEngines:      capacity(p.OfaEngines),
	}
}

func capacity(v int) resourceapi.DeviceCapacity {
	return resourceapi.DeviceCapacity{Value: *resource.NewQuantity(int64(v), resource.DecimalSI)}
}

// Partition is one dynamic MIG device: a profile at a placement.
type Partition struct {
	Profile   Profile
	Placement Placement
	Device    resourceapi.Device
}

// Layout is one GPU in dynamic mode (KEP-4815).
type Layout struct {
	Totals     GPUTotals
	CounterSet resourceapi.CounterSet
	// Partitions are the MIG devices, smallest profile first; within a
	// profile the highest placement comes first, so the first-fit allocator
	// fills a GPU from the top and keeps slice 0, the only place for the
	// largest profiles, free longest.
	Partitions []Partition
	// WholeGPU is the consumption to set on the GPU's whole-GPU device.
	WholeGPU []resourceapi.DeviceCounterConsumption
	byName   map[string]int
	// every partition of every profile, offered or not (Offer): what a GPU
	// instance made outside the plugin takes is known for all of them.
	every []Partition
}

// Offer keeps only the partitions of the named profiles (all when none are
// named); a name the GPU has no profile of is an error.
func (l *Layout) Offer(profiles []string) error {
	if len(profiles) == 0 {
		return nil
	}
	var known []string
	for _, p := range l.every {
		if !slices.Contains(known, p.Profile.Name) {
			known = append(known, p.Profile.Name)
		}
	}
	for _, name := range profiles {
		if !slices.Contains(known, name) {
			return fmt.Errorf("migProfiles: this GPU has no MIG profile %q (it has %v)", name, known)
		}
	}
	l.Partitions, l.byName = nil, map[string]int{}
	for _, p := range l.every {
		if slices.Contains(profiles, p.Profile.Name) {
			l.byName[p.Device.Name] = len(l.Partitions)
			l.Partitions = append(l.Partitions, p)
		}
	}
	return nil
}

// Find returns the partition of a device name.
func (l *Layout) Find(name string) (Partition, bool) {
	i, ok := l.byName[name]
	if !ok {
		return Partition{}, false
	}
	return l.Partitions[i], true
}

// BuildDynamic describes a GPU's dynamic MIG devices: one per (full
// profile, placement), each consuming its GPU's counters, less those that
// decide no packing on this GPU (pruneCounters). units adds the GPU
// milliunits counter (CounterGPUMilliunits) for Kueue.
func BuildDynamic(parent Parent, profiles []Profile, units bool) (Layout, error) {
	return buildDynamic(parent, profiles, units, true)
}

// buildDynamic is BuildDynamic; prune false keeps every counter (tests
// compare the two).
func buildDynamic(parent Parent, profiles []Profile, units, prune bool) (Layout, error) {
	totals := Totals(profiles)
	set := CounterSetName(parent.Index)
	l := Layout{
		Totals:     totals,
		CounterSet: CounterSet(set, totals),
		WholeGPU:   WholeGPUConsumption(set, totals),
		byName:     map[string]int{},
	}
	if !units {
		delete(l.CounterSet.Counters, CounterGPUMilliunits)
		l.WholeGPU = WithoutMilliunits(l.WholeGPU)
	}
	if n := len(l.CounterSet.Counters); n > resourceapi.ResourceSliceMaxCountersPerCounterSet {
		return Layout{}, fmt.Errorf("GPU %d needs %d counters, more than the %d a counter set may have",
			parent.Index, n, resourceapi.ResourceSliceMaxCountersPerCounterSet)
	}
	for _, p := range profiles {
		if p.ComputeVariant {
			continue
		}
		for _, pl := range slices.Backward(p.Placements) {
			dev := dynamicDevice(parent, set, p, pl, totals)
			if !units {
				dev.ConsumesCounters = WithoutMilliunits(dev.ConsumesCounters)
			}
			l.byName[dev.Name] = len(l.Partitions)
			l.Partitions = append(l.Partitions, Partition{Profile: p, Placement: pl, Device: dev})
		}
	}
	if prune {
		pruneCounters(&l)
	}
	l.every = l.Partitions
	return l, nil
}

func dynamicDevice(parent Parent, set string, p Profile, pl Placement, totals GPUTotals) resourceapi.Device {
	attrs := make(map[resourceapi.QualifiedName]resourceapi.DeviceAttribute, len(parent.Attributes)+6)
	maps.Copy(attrs, parent.Attributes)
	// The MIG device's UUID does not exist until prepare creates it.
	delete(attrs, AttrUUID)
	setMigAttributes(attrs, p, totals, parent.UUID)
	return resourceapi.Device{
		Name:             DeviceName(parent.Index, p, pl),
		Attributes:       attrs,
		Capacity:         MigCapacity(p),
		ConsumesCounters: MigDeviceConsumption(set, p, pl, totals),
	}
}

// StaticDevice describes a MIG instance that already exists (static mode):
// it carries the MIG device's own UUID. Nothing is left to the scheduler to
// keep apart (the instances exist and cannot overlap), so its only counter
// is its StaticMilliunits of unitSet, its GPU's UnitCounterSet, for Kueue;
// an empty unitSet publishes none.
func StaticDevice(parent Parent, p Profile, inst Instance, totals GPUTotals, unitSet string) resourceapi.Device {
	attrs := make(map[resourceapi.QualifiedName]resourceapi.DeviceAttribute, len(parent.Attributes)+6)
	maps.Copy(attrs, parent.Attributes)
	setMigAttributes(attrs, p, totals, parent.UUID)
	attrs[AttrUUID] = resourceapi.DeviceAttribute{StringValue: ptr.To(inst.UUID)}
	return resourceapi.Device{
		Name:             StaticDeviceName(parent.Index, p, inst),
		Attributes:       attrs,
		Capacity:         MigCapacity(p),
		ConsumesCounters: MilliunitsConsumption(unitSet, StaticMilliunits(p, totals)),
	}
}

// StaticMilliunits is an existing MIG device's share of its GPU: its
// compute instance's slices. A compute variant ("1c.3g.40gb") is one of
// several compute instances that share a GPU instance; charging each the
// GPU instance's slices would add up to more than the GPU when they all
// exist, and the counter would then refuse allocations of what exists.
func StaticMilliunits(p Profile, totals GPUTotals) int64 {
	return Milliunits(p.CIComputeSlices, totals.ComputeSlices)
}

// Remaining is the layout's counter set less the share of GPU instances
// that exist but that no claim holds. Each takes what the partition of its
// GPU-instance profile at its placement consumes (a compute variant's GPU
// instance is its full profile's); one at a placement this layout does not
// offer takes the whole GPU, as nothing smaller is known to be safe.
func (l *Layout) Remaining(gis []GPUInstance) resourceapi.CounterSet {
	var taken []resourceapi.DeviceCounterConsumption
	for _, gi := range gis {
		taken = append(taken, l.occupied(gi)...)
	}
	return Withhold(l.CounterSet, taken)
}

func (l *Layout) occupied(gi GPUInstance) []resourceapi.DeviceCounterConsumption {
	for _, p := range l.every {
		if p.Profile.GIProfileID == gi.GIProfileID && p.Placement == gi.Placement {
			return p.Device.ConsumesCounters
		}
	}
	return l.WholeGPU
}
