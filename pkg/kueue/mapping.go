// Package kueue describes our devices to Kueue: the deviceClassMappings of
// Kueue's Configuration that charge every request for one of our
// DeviceClasses in GPU milli-units, read from the gpu-milliunits counter
// that each device consumes (KEP-4815 counter-based quota, beta and on by
// default in Kueue v0.19). It is pure: it renders configuration and imports
// no client code.
//
// The mirror of Kueue's configuration types is a few fields of its
// documented configuration file, not its Go API: importing sigs.k8s.io/kueue
// would pin this module to Kueue's Kubernetes libraries.
package kueue

import (
	"cmp"
	"slices"

	resourceapi "k8s.io/api/resource/v1"
)

// Driver is the DRA driver whose slices Kueue reads the counter from.
const Driver = "gpu.gpuaas.io"

// CounterName is the counter every device consumes in thousandths of a GPU
// unit (pkg/mig CounterGPUMilliunits).
const CounterName = "gpu-milliunits"

// DefaultResource is the Kueue resource GPU units are charged as, unless a
// GpuProfile names another (e.g. one per GPU model).
const DefaultResource = "gpu.gpuaas.io/gpu-milliunits"

// OtherDevicesResource is the Kueue resource the DeviceClasses a GpuShape
// names besides our profiles (another driver's NICs) are charged as, by
// count: Kueue refuses a workload whose claim template names a class its
// mappings do not list, so a shape's template must have every class
// mapped; under a resource of their own they add nothing to the GPU units,
// and a shape costs in Kueue what its GPU parts do.
const OtherDevicesResource = "gpu.gpuaas.io/other-devices"

// OtherDevicesQuota is the nominal quota of OtherDevicesResource in the
// ClusterQueues the controller keeps: Kueue admits no workload asking for
// a resource its ClusterQueue does not cover, and this one is there to be
// counted, not to limit (a million devices).
const OtherDevicesQuota = 1_000_000

// Flavor is the ResourceFlavor the controller keeps for our GPU units: it
// names no node labels, as the devices, not the nodes, tell GPUs apart
// (a GpuProfile's kueueResource does that, not a flavor).
const Flavor = "gpuaas"

// DeviceClassMapping is one entry of Kueue's
// Configuration.resources.deviceClassMappings.
type DeviceClassMapping struct {
	Name             string         `json:"name"`
	DeviceClassNames []string       `json:"deviceClassNames"`
	Sources          []SourceConfig `json:"sources,omitempty"`
}

// SourceConfig is one accounting source of a mapping.
type SourceConfig struct {
	Counter *CounterSource `json:"counter,omitempty"`
}

// CounterSource names the counter Kueue charges and where to read it.
type CounterSource struct {
	Name           string                     `json:"name"`
	Driver         string                     `json:"driver"`
	DeviceSelector resourceapi.DeviceSelector `json:"deviceSelector"`
}

// Charge says which Kueue resource one DeviceClass is charged as.
type Charge struct {
	DeviceClass string
	// Resource is the Kueue resource; empty means DefaultResource.
	Resource string
}

// Mappings renders the charges as deviceClassMappings: one per Kueue
// resource, listing its classes, each charging the gpu-milliunits counter
// of our devices. Kueue takes the largest value among the devices that the
// class and the request's selectors match, so a class that matches devices
// of several sizes is charged its largest, as our own admission does.
// The output is sorted, so the same catalog renders the same bytes.
func Mappings(charges []Charge) []DeviceClassMapping {
	byResource := map[string][]string{}
	for _, c := range charges {
		res := cmp.Or(c.Resource, DefaultResource)
		byResource[res] = append(byResource[res], c.DeviceClass)
	}
	out := make([]DeviceClassMapping, 0, len(byResource))
	for res, classes := range byResource {
		slices.Sort(classes)
		m := DeviceClassMapping{Name: res, DeviceClassNames: slices.Compact(classes)}
		if res != OtherDevicesResource { // other drivers' devices carry no counter of ours
			m.Sources = []SourceConfig{{Counter: counterSource()}}
		}
		out = append(out, m)
	}
	slices.SortFunc(out, func(a, b DeviceClassMapping) int { return cmp.Compare(a.Name, b.Name) })
	return out
}

func counterSource() *CounterSource {
	return &CounterSource{
		Name:   CounterName,
		Driver: Driver,
		DeviceSelector: resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{
			Expression: `device.driver == "` + Driver + `"`,
		}},
	}
}

// Resources is the `resources` section of Kueue's Configuration holding
// the mappings and, for profiles asked as extended resources, the
// transformations that charge those in the same units (which need
// ExtendedResourceGate off on Kueue's manager).
func Resources(charges []Charge, prices ...ExtendedPrice) map[string]any {
	out := map[string]any{"deviceClassMappings": Mappings(charges)}
	if len(prices) > 0 {
		out["transformations"] = Transformations(prices)
	}
	return out
}
