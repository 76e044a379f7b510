package mig

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// ApplyLayout makes the MIG devices of profiles on a GPU whose MIG mode is
// enabled, as an admin does with mig-parted before offering it as static
// MIG, beside the MIG devices already there. It first chooses a placement
// for every profile (see planLayout) and refuses a layout that has none
// before making anything; it then makes the devices, largest first. A
// creation that NVML refuses all the same stops it, keeping what it made.
func ApplyLayout(dev nvml.Device, profiles []string) ([]Instance, error) {
	known, err := Profiles(dev)
	if err != nil {
		return nil, err
	}
	existing, err := List(dev)
	if err != nil {
		return nil, err
	}
	plan, err := planLayout(known, existing, profiles)
	if err != nil {
		return nil, layoutError(dev, profiles, existing, err)
	}
	var made []Instance
	for _, step := range plan {
		inst, err := Create(dev, step.profile, step.placement)
		if err != nil {
			return made, layoutError(dev, profiles, existing, err)
		}
		made = append(made, inst)
	}
	return made, nil
}

// layoutError names the layout, the GPU and what was on it already, so an
// admin can tell which node config entry to change.
func layoutError(dev nvml.Device, profiles []string, existing []Instance, err error) error {
	id, ret := dev.GetUUID()
	if ret != nvml.SUCCESS {
		id = "(UUID unknown: " + ret.Error() + ")"
	}
	beside := ""
	if len(existing) > 0 {
		names := make([]string, len(existing))
		for i, inst := range existing {
			names[i] = fmt.Sprintf("%s@%d", inst.Profile, inst.Placement.Start)
		}
		slices.Sort(names)
		beside = " beside " + strings.Join(names, ", ")
	}
	return fmt.Errorf("MIG layout %v does not fit GPU %s%s: %w", profiles, id, beside, err)
}

// layoutStep is one MIG device of a planned layout.
type layoutStep struct {
	profile   Profile
	placement Placement
}

// errNoPlacement says the profiles fit the GPU's counts but not its memory
// slices: every way of placing them makes two overlap.
var errNoPlacement = errors.New("no placement of its profiles leaves each one its own memory slices")

// planLayout chooses a placement for each profile beside the existing
// instances, or says why there is none. It checks what does not depend on
// placements first (profile names, instance counts, compute slices), then
// searches the placements.
func planLayout(known []Profile, existing []Instance, names []string) ([]layoutStep, error) {
	want := make([]Profile, 0, len(names))
	for _, name := range names {
		p, ok := ProfileByName(known, name)
		if !ok {
			return nil, fmt.Errorf("unknown MIG profile %q on this GPU", name)
		}
		want = append(want, p)
	}
	if err := checkCounts(known, existing, want); err != nil {
		return nil, err
	}
	// Largest first: big profiles have the fewest placements, so the
	// search meets a dead end early. Equal profiles end up side by side,
	// which placeFrom relies on, and the plan does not depend on the order
	// the layout lists them in.
	slices.SortFunc(want, func(a, b Profile) int {
		return cmp.Or(cmp.Compare(b.MemorySlices, a.MemorySlices), cmp.Compare(b.ComputeSlices, a.ComputeSlices),
			cmp.Compare(a.Name, b.Name))
	})
	used := make([]Placement, 0, len(existing)+len(want))
	for _, inst := range existing {
		used = append(used, inst.Placement)
	}
	chosen := make([]int, len(want))
	if !placeFrom(want, 0, used, chosen) {
		return nil, errNoPlacement
	}
	plan := make([]layoutStep, len(want))
	for i, p := range want {
		plan[i] = layoutStep{profile: p, placement: p.Placements[chosen[i]]}
	}
	return plan, nil
}

// placeFrom places want[i:] by depth-first search over each profile's
// placements in ascending order, recording the placement indexes in
// chosen. A profile equal to the one before it starts after that one's
// placement: swapping two identical devices gives no new layout, and
// skipping those keeps a refused layout's search small. The depth is the
// layout's size, which checkCounts bounds by the GPU's compute slices (7):
// every profile takes at least one.
func placeFrom(want []Profile, i int, used []Placement, chosen []int) bool {
	if i == len(want) {
		return true
	}
	first := 0
	if i > 0 && want[i-1].Name == want[i].Name {
		first = chosen[i-1] + 1
	}
	for j := first; j < len(want[i].Placements); j++ {
		pl := want[i].Placements[j]
		if overlapsAny(pl, used) {
			continue
		}
		chosen[i] = j
		if placeFrom(want, i+1, append(used, pl), chosen) {
			return true
		}
	}
	return false
}

// checkCounts refuses a layout whose profiles the GPU cannot hold at once
// wherever they are placed: more of a GPU-instance profile than it allows,
// or more compute slices than it has.
func checkCounts(known []Profile, existing []Instance, want []Profile) error {
	perGI := map[int]int{}
	limit := map[int]int{}
	slicesUsed := 0
	seen := map[int]bool{}
	for _, inst := range existing {
		// A GPU instance with several compute instances is listed once per
		// compute instance; it holds its slices once.
		if seen[inst.GIID] {
			continue
		}
		seen[inst.GIID] = true
		perGI[inst.GIProfileID]++
		if p, ok := ProfileByName(known, inst.Profile); ok {
			slicesUsed += p.ComputeSlices
		}
	}
	for _, p := range want {
		perGI[p.GIProfileID]++
		limit[p.GIProfileID] = p.MaxInstances
		slicesUsed += p.ComputeSlices
	}
	for _, p := range want {
		if n, most := perGI[p.GIProfileID], limit[p.GIProfileID]; most > 0 && n > most {
			return fmt.Errorf("%s: %d asked, the GPU allows %d", p.Name, n, most)
		}
	}
	if total := Totals(known).ComputeSlices; slicesUsed > total {
		return fmt.Errorf("%d compute slices asked, the GPU has %d", slicesUsed, total)
	}
	return nil
}

func overlapsAny(pl Placement, used []Placement) bool {
	for _, u := range used {
		if pl.Overlaps(u) {
			return true
		}
	}
	return false
}
