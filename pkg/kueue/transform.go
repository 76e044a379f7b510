package kueue

import (
	"cmp"
	"slices"
	"strconv"

	resourceapi "k8s.io/api/resource/v1"
)

// ReplaceStrategy is Kueue's resource transformation strategy that charges
// the outputs instead of the input resource.
const ReplaceStrategy = "Replace"

// ExtendedResourceGate is the Kueue feature gate (beta, on by default in
// v0.19) under which Kueue charges an extended resource that a DeviceClass
// names through its DRA mappings. It must be off for the transformations
// below: Kueue reads the pod's requests again for it after the
// transformations ran, and either adds the extended resource back under
// its own name (a class no mapping lists: charged outside the GPU units)
// or holds the workload inadmissible (a class mapped with counters, as all
// of ours are: "use ResourceClaimTemplates with CEL selectors for
// counter-based quota", pkg/dra/extended_resources.go).
const ExtendedResourceGate = "KueueDRAIntegrationExtendedResource"

// Transformation is one entry of Kueue's
// Configuration.resources.transformations: each unit of Input is charged
// as Outputs instead.
type Transformation struct {
	Input    string            `json:"input"`
	Strategy string            `json:"strategy"`
	Outputs  map[string]string `json:"outputs"`
}

// ExtendedPrice is what one device of a profile asked as an extended
// resource costs in Kueue: the milli-units a claim template of the same
// class is charged, in the same Kueue resource.
type ExtendedPrice struct {
	ExtendedResource string
	// Resource is the Kueue resource; empty means DefaultResource.
	Resource   string
	Milliunits int64
}

// Transformations renders the prices as Kueue resource transformations: a
// pod asking N of a profile's extended resource (`gpuaas.io/shared-gpu: 1`,
// or `nvidia.com/gpu` where a profile of ours names it) is charged N times
// the milli-units of the profile's device, in the resource the profile's
// templates are charged in, and not the extended resource itself. Sorted,
// so the same catalog renders the same bytes.
func Transformations(prices []ExtendedPrice) []Transformation {
	out := make([]Transformation, 0, len(prices))
	for _, p := range prices {
		out = append(out, Transformation{
			Input:    p.ExtendedResource,
			Strategy: ReplaceStrategy,
			Outputs:  map[string]string{cmp.Or(p.Resource, DefaultResource): strconv.FormatInt(p.Milliunits, 10)},
		})
	}
	slices.SortFunc(out, func(a, b Transformation) int { return cmp.Compare(a.Input, b.Input) })
	return slices.CompactFunc(out, func(a, b Transformation) bool { return a.Input == b.Input })
}

// DeviceMilliunits is the gpu-milliunits counter a device of our driver
// consumes: what Kueue's counter source charges for it. False for a
// device that consumes none (a share of a shared GPU, or a cluster whose
// plugin publishes no counters).
func DeviceMilliunits(d *resourceapi.Device) (int64, bool) {
	var total int64
	found := false
	for _, cc := range d.ConsumesCounters {
		if c, ok := cc.Counters[CounterName]; ok {
			total += c.Value.Value()
			found = true
		}
	}
	return total, found
}
