// Package packing measures how well dynamic MIG packs under churn (issue
// 29): a model of a node's MIG GPUs under NVIDIA's placement rules as
// pkg/mig knows them, a seeded stream of MIG claims that come and go, the
// scheduler's first fit over a published device order, and the bounds it
// is measured against: a best-fit packer that sees the node's state, and a
// packer that may move every claim (Repack).
//
// The model exists so the benchmark can say what the scheduler could have
// done: whether a refused claim had room on some GPU, and which profile the
// node could still take. The benchmark checks the model against the
// upstream allocator on the plugin's own slices, so both agree on what
// fits.
package packing

import (
	"cmp"
	"fmt"
	"math/bits"
	"strings"

	"github.com/gpuaas/gpu-dra-driver/pkg/mig"
)

// Shape is one kind of GPU: the full profiles a stream asks for and what
// the GPU has in total.
type Shape struct {
	Profiles []mig.Profile
	Totals   mig.GPUTotals
}

// NewShape keeps the named full profiles (in the order named) of a GPU's
// profiles; totals come from every profile, as the plugin's do.
func NewShape(all []mig.Profile, names ...string) (Shape, error) {
	s := Shape{Totals: mig.Totals(all)}
	for _, n := range names {
		p, ok := mig.ProfileByName(all, n)
		if !ok || p.ComputeVariant {
			return Shape{}, fmt.Errorf("no full MIG profile %q", n)
		}
		s.Profiles = append(s.Profiles, p)
	}
	return s, nil
}

// Place is one MIG device on a node: a profile (index into Shape.Profiles)
// at a placement of a GPU.
type Place struct {
	GPU, Profile int
	Placement    mig.Placement
}

// gpu is what one GPU has given out: memory slices by bit, and the sums of
// every amount the plugin's counters count.
type gpu struct {
	slices                                       uint64
	compute, sms                                 int
	memory                                       uint64
	copyEngines, decoders, encoders, jpegs, ofas int
	instances                                    []int // by profile
}

// Node is the MIG state of a node of identical GPUs.
type Node struct {
	Shape *Shape
	gpus  []gpu
}

// NewNode is a node of n empty GPUs of one shape.
func NewNode(s *Shape, n int) *Node {
	nd := &Node{Shape: s, gpus: make([]gpu, n)}
	for i := range nd.gpus {
		nd.gpus[i].instances = make([]int, len(s.Profiles))
	}
	return nd
}

// Cut tells whether GPU g holds a MIG device.
func (n *Node) Cut(g int) bool { return n.gpus[g].compute > 0 }

func mask(pl mig.Placement) uint64 { return (uint64(1)<<pl.Size - 1) << pl.Start }

// Fits tells whether p can be made now: its memory slices are free and
// every amount the plugin counts stays within the GPU's totals (the
// counters would refuse it otherwise), including the profile's instance cap.
func (n *Node) Fits(p Place) bool {
	g, pr, t := &n.gpus[p.GPU], n.Shape.Profiles[p.Profile], n.Shape.Totals
	return g.slices&mask(p.Placement) == 0 &&
		g.compute+pr.ComputeSlices <= t.ComputeSlices &&
		g.sms+pr.Multiprocessors <= t.Multiprocessors &&
		g.memory+pr.MemoryBytes <= t.MemoryBytes &&
		g.copyEngines+pr.CopyEngines <= t.CopyEngines &&
		g.decoders+pr.Decoders <= t.Decoders &&
		g.encoders+pr.Encoders <= t.Encoders &&
		g.jpegs+pr.JpegEngines <= t.JpegEngines &&
		g.ofas+pr.OfaEngines <= t.OfaEngines &&
		(pr.MaxInstances <= 0 || g.instances[p.Profile] < pr.MaxInstances)
}

// Add records p as made (the caller checked Fits); Remove undoes it.
func (n *Node) Add(p Place)    { n.change(p, 1) }
func (n *Node) Remove(p Place) { n.change(p, -1) }

func (n *Node) change(p Place, sign int) {
	g, pr := &n.gpus[p.GPU], n.Shape.Profiles[p.Profile]
	if sign > 0 {
		g.slices |= mask(p.Placement)
		g.memory += pr.MemoryBytes
	} else {
		g.slices &^= mask(p.Placement)
		g.memory -= pr.MemoryBytes
	}
	g.compute += sign * pr.ComputeSlices
	g.sms += sign * pr.Multiprocessors
	g.copyEngines += sign * pr.CopyEngines
	g.decoders += sign * pr.Decoders
	g.encoders += sign * pr.Encoders
	g.jpegs += sign * pr.JpegEngines
	g.ofas += sign * pr.OfaEngines
	g.instances[p.Profile] += sign
}

// Candidates are every place of profile prof on the node that fits now,
// GPU by GPU, placements ascending.
func (n *Node) Candidates(prof int) []Place {
	var out []Place
	for g := range n.gpus {
		for _, pl := range n.Shape.Profiles[prof].Placements {
			if p := (Place{GPU: g, Profile: prof, Placement: pl}); n.Fits(p) {
				out = append(out, p)
			}
		}
	}
	return out
}

// Placeable tells whether profile prof fits anywhere on the node.
func (n *Node) Placeable(prof int) bool {
	for g := range n.gpus {
		if n.placeableOn(g, prof) {
			return true
		}
	}
	return false
}

func (n *Node) placeableOn(g, prof int) bool {
	for _, pl := range n.Shape.Profiles[prof].Placements {
		if n.Fits(Place{GPU: g, Profile: prof, Placement: pl}) {
			return true
		}
	}
	return false
}

// Largest is the compute slices of the largest profile of the shape that
// still fits somewhere on the node, 0 when none does: what the biggest
// claim that could arrive next may ask for.
func (n *Node) Largest() int {
	best := 0
	for i, p := range n.Shape.Profiles {
		if p.ComputeSlices > best && n.Placeable(i) {
			best = p.ComputeSlices
		}
	}
	return best
}

// HasRoom tells whether some GPU has at least the compute slices, the
// number of memory slices and the memory profile prof needs free, wherever
// they lie: a claim refused then was refused for where things sit, not for
// lack of capacity. Memory counts as well as memory slices because the
// slices alone overstate it where a profile's slices are not its share of
// the memory (go-nvml's H100 mock: 3g.40gb takes 3 of 7 slices but half
// the memory, so two of them leave a slice free and no memory).
func (n *Node) HasRoom(prof int) bool {
	pr, t := n.Shape.Profiles[prof], n.Shape.Totals
	for _, g := range n.gpus {
		free := t.MemorySlices - bits.OnesCount64(g.slices)
		if t.ComputeSlices-g.compute >= pr.ComputeSlices && free >= pr.MemorySlices && t.MemoryBytes-g.memory >= pr.MemoryBytes {
			return true
		}
	}
	return false
}

// Packer chooses where a claim of a profile goes; false refuses it.
type Packer interface {
	Choose(n *Node, prof int) (Place, bool)
}

// FirstFit is the scheduler's allocator over a published device order:
// the first device of the profile whose counters fit.
type FirstFit []Place

// Choose implements Packer.
func (f FirstFit) Choose(n *Node, prof int) (Place, bool) {
	for _, p := range f {
		if p.Profile == prof && n.Fits(p) {
			return p, true
		}
	}
	return Place{}, false
}

// BestFit is the bound for a packer that never moves a claim: it sees the
// node's state, which a static order cannot, and tries every place that
// fits. It keeps the largest profile the node can still take as large as
// it can; then strands as few compute slices as it can on the GPU it
// fills (free compute that no placement could use any more, as a second
// 3g beside a 3g strands the seventh slice); then fills the GPU that is
// fullest already (partly used GPUs before empty ones); then keeps the
// most compute of other profiles placeable on that GPU (a small profile
// goes where it spoils the fewest larger placements).
type BestFit struct{}

// Choose implements Packer.
func (BestFit) Choose(n *Node, prof int) (Place, bool) {
	var best Place
	var bestKey [4]int
	found := false
	for _, p := range n.Candidates(prof) {
		n.Add(p)
		g := p.GPU
		stranded := n.Shape.Totals.ComputeSlices - n.gpus[g].compute - n.fill(g, 0, 0)
		key := [4]int{n.Largest(), -stranded, n.gpus[g].compute, n.openCompute(g)}
		n.Remove(p)
		if !found || compareKeys(key, bestKey) > 0 {
			best, bestKey, found = p, key, true
		}
	}
	return best, found
}

func compareKeys(a, b [4]int) int {
	for i := range a {
		if c := cmp.Compare(a[i], b[i]); c != 0 {
			return c
		}
	}
	return 0
}

// fill is the most compute slices that places of profiles from prof on
// (placements from placement on, for prof) could still add to GPU g.
func (n *Node) fill(g, prof, placement int) int {
	best := 0
	for i := prof; i < len(n.Shape.Profiles); i++ {
		pr := n.Shape.Profiles[i]
		start := 0
		if i == prof {
			start = placement
		}
		for j := start; j < len(pr.Placements); j++ {
			p := Place{GPU: g, Profile: i, Placement: pr.Placements[j]}
			if !n.Fits(p) {
				continue
			}
			n.Add(p)
			best = max(best, pr.ComputeSlices+n.fill(g, i, j+1))
			n.Remove(p)
			if best == n.Shape.Totals.ComputeSlices-n.gpus[g].compute {
				return best // nothing left to gain
			}
		}
	}
	return best
}

// openCompute sums, over the GPU's profiles and placements that still fit,
// their compute slices: large options weigh more than small ones.
func (n *Node) openCompute(g int) int {
	sum := 0
	for i, pr := range n.Shape.Profiles {
		for _, pl := range pr.Placements {
			if n.Fits(Place{GPU: g, Profile: i, Placement: pl}) {
				sum += pr.ComputeSlices
			}
		}
	}
	return sum
}

// String shows each GPU's memory slices in use (a bit per slice, slice 0
// first) and compute slices in use, for test failures.
func (n *Node) String() string {
	var b strings.Builder
	for i, g := range n.gpus {
		fmt.Fprintf(&b, "gpu %d: ", i)
		for s := range n.Shape.Totals.MemorySlices {
			if g.slices&(1<<s) != 0 {
				b.WriteByte('#')
			} else {
				b.WriteByte('.')
			}
		}
		fmt.Fprintf(&b, " compute %d/%d memory %d/%d MiB\n", g.compute, n.Shape.Totals.ComputeSlices, g.memory>>20, n.Shape.Totals.MemoryBytes>>20)
	}
	return b.String()
}
