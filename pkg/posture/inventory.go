package posture

import (
	"cmp"
	"slices"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"

	gpuapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
)

// DriverName is the driver whose devices have a posture.
const DriverName = gpuapi.DriverName

// Attribute names the plugin publishes (pkg/plugin, pkg/mig,
// pkg/timeslice), unqualified: the driver's domain is implied. They are
// repeated here, not imported, because those packages link NVML and the
// controller must not; a test checks they agree.
const (
	attrType        = "type"
	attrUUID        = "uuid"
	attrParentUUID  = "parentUUID"
	attrIndex       = "index"
	attrProductName = "productName"
	attrProfile     = "profile"
	// attrMemoryLimitEnforced is on replicas and shares
	// (device.AttrMemoryLimitEnforced).
	attrMemoryLimitEnforced = "memoryLimitEnforced"
)

// pool is the node's pool as the newest generation of its slices has it.
type pool struct {
	name string
	gpus []*gpu
	// devices by name, for matching allocation results.
	devices map[string]*device
	// counterSets are the pool's shared counters by name (KEP-4815).
	counterSets map[string]resourceapi.CounterSet
	// leases are the claims (namespace/name) holding a device of the pool
	// through a request with allocationMode All.
	leases map[string]bool
}

// gpu is the devices of one GPU: all that carry its index.
type gpu struct {
	key     string
	index   int
	uuid    string
	product string
	devices []*device
	// memoryLimit is what its replicas or shares say of their memory;
	// "" when none says (whole and MIG GPUs, an older plugin).
	memoryLimit gpuaas.MemoryLimit
}

// device is one published device and the allocations that hold it.
type device struct {
	api    *resourceapi.Device
	typ    string
	allocs []allocation
}

// readPool indexes the node's devices by GPU. Of the pool only the slices
// of its newest generation count, as for the scheduler: older ones are
// leftovers of a republish in progress.
func readPool(node string, slices []resourceapi.ResourceSlice) *pool {
	p := &pool{name: node, devices: map[string]*device{}, counterSets: map[string]resourceapi.CounterSet{}, leases: map[string]bool{}}
	var newest int64
	for i := range slices {
		if ours(&slices[i], node) {
			newest = max(newest, slices[i].Spec.Pool.Generation)
		}
	}
	byKey := map[string]*gpu{}
	for i := range slices {
		s := &slices[i]
		if !ours(s, node) || s.Spec.Pool.Generation < newest {
			continue
		}
		for _, cs := range s.Spec.SharedCounters {
			p.counterSets[cs.Name] = cs
		}
		for j := range s.Spec.Devices {
			p.add(byKey, &s.Spec.Devices[j])
		}
	}
	sortGPUs(p.gpus)
	return p
}

func ours(s *resourceapi.ResourceSlice, node string) bool {
	return s.Spec.Driver == DriverName && s.Spec.Pool.Name == node
}

func (p *pool) add(byKey map[string]*gpu, api *resourceapi.Device) {
	if _, dup := p.devices[api.Name]; dup {
		return // the same name twice is an invalid pool; count it once
	}
	d := &device{api: api, typ: stringAttr(api, attrType)}
	p.devices[api.Name] = d
	key, index := gpuKey(api)
	g := byKey[key]
	if g == nil {
		g = &gpu{key: key, index: index}
		byKey[key] = g
		p.gpus = append(p.gpus, g)
	}
	g.devices = append(g.devices, d)
	if g.uuid == "" || d.typ == string(gpuaas.DeviceTypeGPU) {
		g.uuid = gpuUUID(api)
	}
	if g.product == "" {
		g.product = stringAttr(api, attrProductName)
	}
	g.addMemoryLimit(api)
}

// addMemoryLimit takes in one device's memoryLimitEnforced: a GPU is
// DriverEnforced only when every device that says anything says so.
func (g *gpu) addMemoryLimit(api *resourceapi.Device) {
	a, ok := attribute(api, attrMemoryLimitEnforced)
	switch {
	case !ok || a.BoolValue == nil:
	case !*a.BoolValue:
		g.memoryLimit = gpuaas.MemoryLimitNotEnforced
	case g.memoryLimit == "":
		g.memoryLimit = gpuaas.MemoryLimitDriverEnforced
	}
}

// gpuKey groups devices by GPU: every device of a GPU carries its index
// (a MIG device's own UUID, when it has one, is not the GPU's). Devices
// without an index fall back to their GPU's UUID.
func gpuKey(d *resourceapi.Device) (string, int) {
	if a, ok := attribute(d, attrIndex); ok && a.IntValue != nil {
		return "index/" + strconv.FormatInt(*a.IntValue, 10), int(*a.IntValue)
	}
	if u := gpuUUID(d); u != "" {
		return "uuid/" + u, -1
	}
	return "device/" + d.Name, -1
}

// gpuUUID is the UUID of the device's GPU: parentUUID on MIG devices,
// replicas and shares, uuid on a whole GPU.
func gpuUUID(d *resourceapi.Device) string {
	if u := stringAttr(d, attrParentUUID); u != "" {
		return u
	}
	return stringAttr(d, attrUUID)
}

func sortGPUs(gpus []*gpu) {
	slices.SortStableFunc(gpus, func(a, b *gpu) int {
		// Unknown indexes (-1) last.
		if (a.index < 0) != (b.index < 0) {
			return cmp.Compare(b.index, a.index)
		}
		return cmp.Or(cmp.Compare(a.index, b.index), strings.Compare(a.key, b.key))
	})
}

// mode tells how the GPU is offered from the types of its devices.
func (g *gpu) mode() gpuaas.GpuMode {
	mode := gpuaas.GpuModeWhole
	for _, d := range g.devices {
		switch gpuaas.DeviceType(d.typ) {
		case gpuaas.DeviceTypeMIG:
			if partitionable(d.api) {
				return gpuaas.GpuModeMigDynamic
			}
			mode = gpuaas.GpuModeMigStatic
		case gpuaas.DeviceTypeTimeSlice:
			return gpuaas.GpuModeTimeSliced
		case gpuaas.DeviceTypeShared:
			return gpuaas.GpuModeShared
		}
	}
	return mode
}

// partitionable reports whether a MIG device is a dynamic one: it consumes
// counters that keep it apart from others on its GPU. A static MIG device
// consumes at most the GPU milliunits that Kueue counts.
func partitionable(d *resourceapi.Device) bool {
	for _, c := range d.ConsumesCounters {
		for name := range c.Counters {
			if name != counterGPUMilliunits {
				return true
			}
		}
	}
	return false
}

func (g *gpu) deviceNames() []string {
	out := make([]string, 0, len(g.devices))
	for _, d := range g.devices {
		out = append(out, d.api.Name)
	}
	return out
}

func (g *gpu) allocatedNames() []string {
	var out []string
	for _, d := range g.devices {
		if len(d.allocs) > 0 {
			out = append(out, d.api.Name)
		}
	}
	slices.Sort(out)
	return out
}

func (g *gpu) claims() []string {
	var out []string
	for _, d := range g.devices {
		for _, a := range d.allocs {
			out = append(out, a.claim)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// attribute looks a name up unqualified, then in the driver's domain: the
// API treats both as the same attribute.
func attribute(d *resourceapi.Device, name string) (resourceapi.DeviceAttribute, bool) {
	if a, ok := d.Attributes[resourceapi.QualifiedName(name)]; ok {
		return a, true
	}
	a, ok := d.Attributes[resourceapi.QualifiedName(DriverName+"/"+name)]
	return a, ok
}

func stringAttr(d *resourceapi.Device, name string) string {
	if a, ok := attribute(d, name); ok && a.StringValue != nil {
		return *a.StringValue
	}
	return ""
}
