package packing

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/gpuaas/gpu-dra-driver/pkg/mig"
)

const gib = 1 << 30

// a100 is an A100 40GB's full profiles as NVIDIA documents them (memory
// slices 0-7, 7 compute slices), without engines: the model's rules
// without a mock machine.
func a100(t testing.TB) *Shape {
	t.Helper()
	placements := func(size int, starts ...int) []mig.Placement {
		var out []mig.Placement
		for _, s := range starts {
			out = append(out, mig.Placement{Start: s, Size: size})
		}
		return out
	}
	all := []mig.Profile{
		{Name: "1g.5gb", ComputeSlices: 1, MemorySlices: 1, MaxInstances: 7, MemoryBytes: 5 * gib, Placements: placements(1, 0, 1, 2, 3, 4, 5, 6)},
		{Name: "2g.10gb", ComputeSlices: 2, MemorySlices: 2, MaxInstances: 3, MemoryBytes: 10 * gib, Placements: placements(2, 0, 2, 4)},
		{Name: "3g.20gb", ComputeSlices: 3, MemorySlices: 4, MaxInstances: 2, MemoryBytes: 20 * gib, Placements: placements(4, 0, 4)},
		{Name: "4g.20gb", ComputeSlices: 4, MemorySlices: 4, MaxInstances: 1, MemoryBytes: 20 * gib, Placements: placements(4, 0)},
		{Name: "7g.40gb", ComputeSlices: 7, MemorySlices: 8, MaxInstances: 1, MemoryBytes: 40 * gib, Placements: placements(8, 0)},
	}
	s, err := NewShape(all, "1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb")
	if err != nil {
		t.Fatal(err)
	}
	return &s
}

// Profile indexes of the a100 shape.
const (
	p1g = iota
	p2g
	p3g
	p4g
	p7g
)

func at(gpu, prof, start int, s *Shape) Place {
	for _, pl := range s.Profiles[prof].Placements {
		if pl.Start == start {
			return Place{GPU: gpu, Profile: prof, Placement: pl}
		}
	}
	panic("no such placement")
}

func TestFitsFollowsPlacementsAndCounts(t *testing.T) {
	s := a100(t)
	n := NewNode(s, 1)
	n.Add(at(0, p4g, 0, s))
	if n.Fits(at(0, p3g, 0, s)) {
		t.Error("3g at slice 0 fits over 4g at slice 0")
	}
	if !n.Fits(at(0, p3g, 4, s)) {
		t.Error("3g at slice 4 does not fit beside 4g")
	}
	n.Add(at(0, p3g, 4, s))
	for start := range 7 {
		if n.Fits(at(0, p1g, start, s)) {
			t.Errorf("1g at %d fits on a full GPU", start)
		}
	}
	n.Remove(at(0, p4g, 0, s))
	if !n.Fits(at(0, p4g, 0, s)) || n.Fits(at(0, p7g, 0, s)) {
		t.Error("after removing 4g: 4g should fit again, 7g not (3g holds slices 4-7)")
	}
}

// 3g at 0, 2g at 4 and 1g at 6 leave a compute slice and memory slice 7
// free, where no 1g can go: refused with room, the figure the benchmark
// counts, which the GPU's counts alone cannot tell.
func TestRoomIsNotPlaceable(t *testing.T) {
	s := a100(t)
	n := NewNode(s, 1)
	for _, p := range []Place{at(0, p3g, 0, s), at(0, p2g, 4, s), at(0, p1g, 6, s)} {
		n.Add(p)
	}
	if n.Placeable(p1g) || !n.HasRoom(p1g) {
		t.Errorf("1g placeable %v (want false), room %v (want true)", n.Placeable(p1g), n.HasRoom(p1g))
	}
	if n.HasRoom(p2g) {
		t.Error("room for 2g with one compute slice free")
	}
}

func TestLargest(t *testing.T) {
	s := a100(t)
	for _, c := range []struct {
		name string
		held []Place
		want int
	}{
		{"empty", nil, 7},
		{"1g at 6 leaves 4g at 0", []Place{at(0, p1g, 6, s)}, 4},
		{"1g at 3 leaves 3g at 4", []Place{at(0, p1g, 3, s)}, 3},
		{"1g at 3 and 6 leave 2g at 4", []Place{at(0, p1g, 3, s), at(0, p1g, 6, s)}, 2},
		{"full", []Place{at(0, p4g, 0, s), at(0, p3g, 4, s)}, 0},
	} {
		n := NewNode(s, 1)
		for _, p := range c.held {
			n.Add(p)
		}
		if got := n.Largest(); got != c.want {
			t.Errorf("%s: largest %d, want %d", c.name, got, c.want)
		}
	}
}

func TestFirstFitTakesTheFirstThatFits(t *testing.T) {
	s := a100(t)
	n := NewNode(s, 2)
	order := FirstFit{at(1, p2g, 0, s), at(1, p1g, 0, s), at(0, p1g, 6, s)}
	var got []Place
	for range 3 {
		p, ok := order.Choose(n, p1g)
		if !ok {
			break
		}
		got = append(got, p)
		n.Add(p)
	}
	if want := []Place{at(1, p1g, 0, s), at(0, p1g, 6, s)}; !slices.Equal(got, want) {
		t.Errorf("first fit placed %v, want %v then a refusal", got, want)
	}
}

// A 1g beside a 3g at the top of GPU 0 goes there, not to the empty GPU 1:
// that keeps a 7g placeable; the 7g then gets GPU 1.
func TestBestFitFillsPartlyUsedGPUs(t *testing.T) {
	s := a100(t)
	n := NewNode(s, 2)
	n.Add(at(0, p3g, 4, s))
	p, ok := BestFit{}.Choose(n, p1g)
	if !ok || p.GPU != 0 {
		t.Fatalf("best fit put the 1g at %+v (%v), want GPU 0", p, ok)
	}
	n.Add(p)
	if p, ok := (BestFit{}).Choose(n, p7g); !ok || p.GPU != 1 {
		t.Errorf("best fit put the 7g at %+v (%v), want GPU 1", p, ok)
	}
}

func TestRepackKnownPackings(t *testing.T) {
	s := a100(t)
	r := NewRepack(s, 1)
	for _, c := range []struct {
		name   string
		counts []int
		want   bool
	}{
		{"4g+3g", []int{0, 0, 1, 1, 0}, true},
		{"4g+2g+1g", []int{1, 1, 0, 1, 0}, true},
		{"3g+2g+2g only with 3g at 4", []int{0, 2, 1, 0, 0}, true},
		{"3g+3g+1g", []int{1, 0, 2, 0, 0}, false},
		{"7g+1g", []int{1, 0, 0, 0, 1}, false},
		{"seven 1g", []int{7, 0, 0, 0, 0}, true},
		{"eight 1g", []int{8, 0, 0, 0, 0}, false},
		{"4g+3g+1g", []int{1, 0, 1, 1, 0}, false},
	} {
		if got := r.Feasible(c.counts); got != c.want {
			t.Errorf("%s: feasible %v, want %v", c.name, got, c.want)
		}
	}
}

// Repack agrees with a search over actual placements on the model, on
// random demands for two GPUs.
func TestRepackMatchesPlacementSearch(t *testing.T) {
	s := a100(t)
	r := NewRepack(s, 2)
	rng := rand.New(rand.NewPCG(29, 1))
	limits := []int{9, 4, 3, 2, 2}
	yes := 0
	for range 300 {
		counts := make([]int, len(limits))
		for i, l := range limits {
			counts[i] = rng.IntN(l + 1)
		}
		want := searchPlacements(NewNode(s, 2), counts)
		if want {
			yes++
		}
		if got := r.Feasible(counts); got != want {
			t.Errorf("%v: repack says %v, placement search %v", counts, got, want)
		}
	}
	if yes == 0 || yes == 300 {
		t.Errorf("%d of 300 demands feasible: the test compares nothing", yes)
	}
}

// searchPlacements places the demand, largest profiles first, trying
// every place that fits; claims of one profile take places in increasing
// order, so each set of places is tried once.
func searchPlacements(n *Node, counts []int) bool {
	var claims []int
	for prof := len(counts) - 1; prof >= 0; prof-- {
		for range counts[prof] {
			claims = append(claims, prof)
		}
	}
	var place func(i, from int) bool
	place = func(i, from int) bool {
		if i == len(claims) {
			return true
		}
		cands := n.Candidates(claims[i])
		for j := range cands {
			if i > 0 && claims[i-1] == claims[i] && j < from {
				continue
			}
			n.Add(cands[j])
			next := n.Candidates(claims[i])
			// where this candidate sits among the next claim's list
			k := slices.IndexFunc(next, func(p Place) bool { return !less(p, cands[j]) })
			if k < 0 {
				k = len(next)
			}
			ok := place(i+1, k)
			n.Remove(cands[j])
			if ok {
				return true
			}
		}
		return false
	}
	return place(0, 0)
}

func less(a, b Place) bool {
	return a.GPU < b.GPU || a.GPU == b.GPU && a.Placement.Start < b.Placement.Start
}

func TestStreamIsSeededAndConsistent(t *testing.T) {
	s := a100(t)
	a := Stream(s, Mixes[0], 8, 500, 1.1, 7)
	if b := Stream(s, Mixes[0], 8, 500, 1.1, 7); !slices.Equal(a, b) {
		t.Error("one seed gave two streams")
	}
	if c := Stream(s, Mixes[0], 8, 500, 1.1, 8); slices.Equal(a, c) {
		t.Error("two seeds gave one stream")
	}
	arrived, departed := map[int]int{}, map[int]bool{}
	perProfile := make([]int, len(s.Profiles))
	for _, e := range a {
		if e.Arrive {
			if _, ok := arrived[e.Claim]; ok {
				t.Fatalf("claim %d arrives twice", e.Claim)
			}
			arrived[e.Claim] = e.Profile
			perProfile[e.Profile]++
			continue
		}
		if prof, ok := arrived[e.Claim]; !ok || departed[e.Claim] || prof != e.Profile {
			t.Fatalf("claim %d departs before arriving, twice, or as another profile", e.Claim)
		}
		departed[e.Claim] = true
	}
	if len(arrived) != 500 {
		t.Errorf("%d arrivals, want 500", len(arrived))
	}
	if perProfile[p1g] <= perProfile[p7g] {
		t.Errorf("small-heavy asked for %d 1g and %d 7g", perProfile[p1g], perProfile[p7g])
	}
}

func TestRunRefusesWhatDoesNotFit(t *testing.T) {
	s := a100(t)
	events := []Event{{Arrive: true, Claim: 0, Profile: p4g}, {Arrive: true, Claim: 1, Profile: p3g}}
	_, err := Run(s, 1, events, func(_ *Node, _, prof int) (Place, bool) { return at(0, prof, 0, s), true }, nil)
	if err == nil {
		t.Error("a 3g placed over a 4g was accepted")
	}
}

func TestRunCounts(t *testing.T) {
	s := a100(t)
	events := []Event{
		{Arrive: true, Claim: 0, Profile: p3g}, // 3g at 0 (first fit below)
		{Arrive: true, Claim: 1, Profile: p4g}, // refused, with room: 4 compute, slices 4-7
		{Claim: 0, Profile: p3g},
		{Arrive: true, Claim: 2, Profile: p7g},
	}
	order := FirstFit{at(0, p3g, 0, s), at(0, p3g, 4, s), at(0, p4g, 0, s), at(0, p7g, 0, s)}
	r, err := RunPacker(s, 1, events, order)
	if err != nil {
		t.Fatal(err)
	}
	// largest after each event: 3 (3g at 0 leaves 3g at 4), 3, 7, 0
	want := Result{Arrivals: 3, Refused: 1, RefusedWithRoom: 1, LargestMean: float64(3+3+7+0) / 4}
	if r != want {
		t.Errorf("got %+v, want %+v", r, want)
	}
}

func TestResultAddWeighsByArrivals(t *testing.T) {
	r := Result{Arrivals: 1, Refused: 1, LargestMean: 7}
	r.Add(Result{Arrivals: 3, RefusedWithRoom: 2, LargestMean: 3})
	if want := (Result{Arrivals: 4, Refused: 1, RefusedWithRoom: 2, LargestMean: 4}); r != want {
		t.Errorf("got %+v, want %+v", r, want)
	}
}

// A second 3g does not go beside the first, where it would strand the
// GPU's seventh compute slice, but to the upper half of an empty GPU,
// which a 4g can complete, while a third GPU stays whole for 7g.
func TestBestFitStrandsNoCompute(t *testing.T) {
	s := a100(t)
	n := NewNode(s, 3)
	n.Add(at(0, p3g, 4, s))
	if p, ok := (BestFit{}).Choose(n, p3g); !ok || p != at(1, p3g, 4, s) {
		t.Errorf("best fit put the second 3g at %+v (%v), want GPU 1 at slice 4", p, ok)
	}
}
