package mig

import "slices"

// Publishing for packing (issue 29).
//
// The scheduler's allocator is first fit: a claim gets the first device,
// in slice and device order, whose counters fit. So the order we publish
// is the packing policy. Within a GPU, Partitions lists each profile's
// highest placement first, so small profiles fill a GPU from the end that
// the large ones (4g and the lower 3g, which start at slice 0) do not need.
// Across GPUs, each GPU's devices come together, lowest index first, so
// small claims fill partly used GPUs before empty ones, and the empty ones
// stay whole for 7g.
//
// One placement is better deferred across GPUs: the lower half of a GPU
// for a profile whose size and the next larger profile's make exactly a
// GPU (3g and 4g of 7 compute slices). That lower 3g placement is the only
// place of 4g; in GPU order, a second 3g claim takes it on the GPU that
// already holds one, and strands the GPU's seventh compute slice (and, on
// an 80 GB H100, its memory) where 3g + 4g would have filled it. Listed
// after every GPU's other devices, a 3g first takes the upper half of each
// GPU, which pairs with a 4g, and the lower halves only when no upper half
// is left. BenchmarkMIGPackingOrders (pkg/mig/packing) measured this
// against the plain GPU order and against deferring the lower placements
// of 1g and 2g too (which spreads small claims over every GPU and leaves
// fewer GPUs whole for 7g): it is the only one of those that refuses fewer
// claims than the plain order on every mix (BENCHMARKS.md, issue 29).

// Deferred tells whether first fit should reach the partition only after
// every GPU's partitions that are not deferred (see above): its placement
// takes every placement of an offered, larger profile that with it would
// fill the GPU's compute slices, and its profile has a placement that
// leaves that larger profile room. The larger profiles are those the
// layout offers: where 4g is not offered, nothing pairs with the upper 3g
// and spreading 3g over the GPUs would only cost 7g its whole GPUs.
func (l *Layout) Deferred(part Partition) bool {
	p := part.Profile
	if p.ComputeVariant {
		return false
	}
	for _, other := range l.Partitions {
		q := other.Profile
		if q.ComputeVariant || q.ComputeSlices <= p.ComputeSlices || p.ComputeSlices+q.ComputeSlices != l.Totals.ComputeSlices {
			continue
		}
		if overlapsAll(part.Placement, q.Placements) &&
			slices.ContainsFunc(p.Placements, func(o Placement) bool { return !overlapsAny(o, q.Placements) }) {
			return true
		}
	}
	return false
}

func overlapsAll(pl Placement, all []Placement) bool {
	for _, o := range all {
		if !pl.Overlaps(o) {
			return false
		}
	}
	return len(all) > 0
}
