package packing

// Repack is the ideal the other packers are measured against: a packer
// free to move every claim to any GPU and placement at every arrival (MIG
// cannot do that to running workloads; nothing can beat it). It accepts a
// claim exactly when some arrangement of every claim on the node, the new
// one included, fits under the rules the Node model applies, so its
// refusals are those no placement policy could avoid, and "refused with
// room" means nothing for it.
type Repack struct {
	shape *Shape
	gpus  int
	// configs are the count vectors (instances per profile) one GPU can
	// hold at once, every one of them (the set is closed under taking
	// fewer), the empty one left out.
	configs [][]int
	memo    map[uint64]bool
}

// NewRepack enumerates what one GPU of the shape can hold.
func NewRepack(s *Shape, gpus int) *Repack {
	r := &Repack{shape: s, gpus: gpus, memo: map[uint64]bool{}}
	one := NewNode(s, 1)
	counts := make([]int, len(s.Profiles))
	seen := map[uint64]bool{}
	var walk func(prof, placement int)
	walk = func(prof, placement int) {
		// Places are taken in (profile, placement) order, each at most
		// once, so every set of places is visited once.
		for i := prof; i < len(s.Profiles); i++ {
			start := 0
			if i == prof {
				start = placement
			}
			for j := start; j < len(s.Profiles[i].Placements); j++ {
				p := Place{Profile: i, Placement: s.Profiles[i].Placements[j]}
				if !one.Fits(p) {
					continue
				}
				one.Add(p)
				counts[i]++
				if k := key(0, counts); !seen[k] {
					seen[k] = true
					r.configs = append(r.configs, append([]int(nil), counts...))
				}
				walk(i, j+1)
				counts[i]--
				one.Remove(p)
			}
		}
	}
	walk(0, 0)
	return r
}

// key packs a GPU count and a count vector (at most 7 profiles of at most
// 255 instances, which a node of MIG GPUs never exceeds) into a map key.
func key(gpus int, counts []int) uint64 {
	k := uint64(gpus)
	for _, c := range counts {
		k = k<<8 | uint64(c)
	}
	return k
}

// Feasible tells whether the node's GPUs can hold counts[i] instances of
// every profile i at once, in some arrangement.
func (r *Repack) Feasible(counts []int) bool {
	return r.fits(r.gpus, counts)
}

func (r *Repack) fits(gpus int, d []int) bool {
	largest, compute := -1, 0
	for i, c := range d {
		if c > 0 && (largest < 0 || r.shape.Profiles[i].ComputeSlices > r.shape.Profiles[largest].ComputeSlices) {
			largest = i
		}
		compute += c * r.shape.Profiles[i].ComputeSlices
	}
	if largest < 0 {
		return true
	}
	if gpus == 0 || compute > gpus*r.shape.Totals.ComputeSlices {
		return false
	}
	k := key(gpus, d)
	if v, ok := r.memo[k]; ok {
		return v
	}
	// Some GPU holds a claim of the largest profile left; GPUs are alike,
	// so let it be the next one: only configurations with one are tried.
	ok := false
	rest := make([]int, len(d))
	for _, c := range r.configs {
		if c[largest] == 0 || !within(c, d) {
			continue
		}
		for i := range d {
			rest[i] = d[i] - c[i]
		}
		if r.fits(gpus-1, rest) {
			ok = true
			break
		}
	}
	r.memo[k] = ok
	return ok
}

func within(c, d []int) bool {
	for i := range c {
		if c[i] > d[i] {
			return false
		}
	}
	return true
}

// RunRepack plays a stream with the Repack packer. RefusedWithRoom stays
// zero: a refusal there is for lack of capacity by construction.
func RunRepack(s *Shape, gpus int, events []Event) Result {
	r := NewRepack(s, gpus)
	live := make([]int, len(s.Profiles))
	held := map[int]bool{}
	var res Result
	largest := 0
	for _, e := range events {
		if e.Arrive {
			res.Arrivals++
			live[e.Profile]++
			if r.Feasible(live) {
				held[e.Claim] = true
			} else {
				live[e.Profile]--
				res.Refused++
			}
		} else if held[e.Claim] {
			live[e.Profile]--
			delete(held, e.Claim)
		}
		largest += r.largest(live)
	}
	if len(events) > 0 {
		res.LargestMean = float64(largest) / float64(len(events))
	}
	return res
}

// largest is the compute slices of the largest profile that one more
// claim of could be added to live, moves allowed.
func (r *Repack) largest(live []int) int {
	best := 0
	for i, p := range r.shape.Profiles {
		if p.ComputeSlices <= best {
			continue
		}
		live[i]++
		if r.Feasible(live) {
			best = p.ComputeSlices
		}
		live[i]--
	}
	return best
}
