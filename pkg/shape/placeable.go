package shape

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpuaas/gpu-dra-driver/pkg/posture"
	"github.com/gpuaas/gpu-dra-driver/pkg/quota"
)

// Request is one part of a shape as Placeable counts it: the CEL
// selectors of the DeviceClass it names, and how many devices it takes.
type Request struct {
	Name      string
	Selectors []string
	// All takes every matching device of the node (allocationMode All);
	// Count is ignored then.
	All   bool
	Count int
}

// Query is a shape as Placeable counts it.
type Query struct {
	Requests []Request
	// Align is the attribute every device of an instance shares; empty
	// for none.
	Align resourceapi.FullyQualifiedName
}

// Count is how many more instances fit now.
type Count struct {
	// Placeable is the number of disjoint instances that fit, summed over
	// nodes.
	Placeable int
	// Nodes publishing devices in a node-local slice.
	Nodes int
	// NodesWithRoom are those of them where at least one instance fits.
	NodesWithRoom int
}

// Message is the count in words: "0 of 3 nodes have a free GPU+NIC on one
// PCIe root" (described as Describe does).
func (c Count) Message(described string) string {
	return fmt.Sprintf("%d of %d nodes have a free %s", c.NodesWithRoom, c.Nodes, described)
}

// Placeable counts how many more disjoint instances of the shape q fit
// now, from what the scheduler sees: the ResourceSlices of every driver
// (only each pool's newest generation) and the claims' allocations. Per
// node, it takes instances greedily: for each value of the alignment
// attribute (or the node as a whole), devices that are not allocated, not
// tainted NoSchedule or NoExecute (in their slice, or by a DeviceTaintRule
// among rules: an admin's drain), and whose counters (our partitionable
// devices' shared counters) fit in what the node's allocated devices leave
// (a whole GPU is not free while one of its MIG devices is allocated); a
// request with All takes every matching untainted device of the node, so
// the node gives at most one instance and none if any of them is taken.
// Greedy is not always the most a node could give (an exact count is a
// set-packing problem), but with the shapes sold (one or all of a kind per
// root or NUMA node) it is.
//
// What it does not see, and so overstates: cordoned nodes and slices
// that are not node-local (network-attached devices); and it counts a
// multi-allocatable device with room for another share as taken once
// allocated, which understates.
func Placeable(ctx context.Context, q Query, slices []*resourceapi.ResourceSlice, claims []*resourceapi.ResourceClaim, rules []*resourceapi.DeviceTaintRule) Count {
	return NewMatcher().Placeable(ctx, q, slices, claims, rules)
}

// Matcher remembers which devices a request's selectors match across
// counts, so a count evaluates CEL only for devices it has not seen (most
// of the cost of a count: BENCHMARKS.md). Devices are known by their
// address: the slices must be those of an informer's store, read without
// a deep copy, whose devices do not change in place (an updated slice is a
// new object); a device no longer seen by a count is forgotten, so its
// address cannot be reused while remembered. Safe for concurrent use.
type Matcher struct {
	mu    sync.Mutex
	known map[*resourceapi.Device]map[string]bool
}

// NewMatcher is a Matcher that knows no device yet.
func NewMatcher() *Matcher {
	return &Matcher{known: map[*resourceapi.Device]map[string]bool{}}
}

// Placeable is the package's Placeable with m's memory of matches.
func (m *Matcher) Placeable(ctx context.Context, q Query, slices []*resourceapi.ResourceSlice, claims []*resourceapi.ResourceClaim, rules []*resourceapi.DeviceTaintRule) Count {
	m.mu.Lock()
	defer m.mu.Unlock()
	nodes := readNodes(slices, allocated(claims), drains(rules))
	keys := make([]string, len(q.Requests))
	for i := range q.Requests {
		keys[i] = strings.Join(q.Requests[i].Selectors, "\x00")
	}
	seen := make(map[*resourceapi.Device]map[string]bool, len(m.known))
	for _, n := range nodes {
		for _, d := range n.devs {
			known := m.known[d.api]
			if known == nil {
				known = map[string]bool{}
			}
			seen[d.api] = known
			d.known, d.keys = known, keys
			d.group, d.grouped = groupOf(d.api, q.Align)
		}
	}
	m.known = seen
	var c Count
	names := make([]string, 0, len(nodes))
	for name := range nodes {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		c.Nodes++
		if n := nodes[name].count(ctx, q); n > 0 {
			c.NodesWithRoom++
			c.Placeable += n
		}
	}
	return c
}

type poolKey struct{ driver, pool string }

func allocated(claims []*resourceapi.ResourceClaim) map[quota.DeviceID]bool {
	out := map[quota.DeviceID]bool{}
	for _, c := range claims {
		if c.Status.Allocation == nil {
			continue
		}
		for _, r := range c.Status.Allocation.Devices.Results {
			out[quota.DeviceID{Driver: r.Driver, Pool: r.Pool, Device: r.Device}] = true
		}
	}
	return out
}

// node is what one node offers.
type node struct {
	devs []*device
	// left is what remains of each counter set (driver/pool/set) once
	// the allocated devices took theirs, in milli-units.
	left map[string]map[string]int64
}

type device struct {
	id    quota.DeviceID
	api   *resourceapi.Device
	taken bool // allocated to a claim
	// healthy: no NoSchedule or NoExecute taint.
	healthy bool
	used    bool // by an instance counted in this walk
	// known are the device's matches by selectors (the requests' keys).
	known map[string]bool
	keys  []string
	// group is its value of the alignment attribute; grouped is false
	// when it has none (it cannot be part of an aligned instance).
	group   string
	grouped bool
}

func readNodes(list []*resourceapi.ResourceSlice, taken map[quota.DeviceID]bool, drained func(quota.DeviceID) bool) map[string]*node {
	newest := map[poolKey]int64{}
	for _, s := range list {
		k := poolKey{s.Spec.Driver, s.Spec.Pool.Name}
		if g, ok := newest[k]; !ok || s.Spec.Pool.Generation > g {
			newest[k] = s.Spec.Pool.Generation
		}
	}
	nodes := map[string]*node{}
	for _, s := range list {
		if s.Spec.NodeName == nil || *s.Spec.NodeName == "" || s.Spec.Pool.Generation < newest[poolKey{s.Spec.Driver, s.Spec.Pool.Name}] {
			continue
		}
		n := nodes[*s.Spec.NodeName]
		if n == nil {
			n = &node{left: map[string]map[string]int64{}}
			nodes[*s.Spec.NodeName] = n
		}
		for _, cs := range s.Spec.SharedCounters {
			set := map[string]int64{}
			for name, c := range cs.Counters {
				set[name] = c.Value.MilliValue()
			}
			n.left[counterSetKey(s.Spec.Driver, s.Spec.Pool.Name, cs.Name)] = set
		}
		for i := range s.Spec.Devices {
			d := &s.Spec.Devices[i]
			id := quota.DeviceID{Driver: s.Spec.Driver, Pool: s.Spec.Pool.Name, Device: d.Name}
			n.devs = append(n.devs, &device{id: id, api: d, taken: taken[id], healthy: untainted(d) && !drained(id)})
		}
	}
	for _, n := range nodes {
		for _, d := range n.devs {
			if d.taken {
				n.consume(d, 1)
			}
		}
	}
	return nodes
}

func counterSetKey(driver, pool, set string) string { return driver + "/" + pool + "/" + set }

func untainted(d *resourceapi.Device) bool {
	for _, t := range d.Taints {
		if posture.KeepsWorkOff(t.Effect) {
			return false
		}
	}
	return true
}

// drains says which devices the DeviceTaintRules keep new claims off (an
// admin's drain), as the scheduler applies them: any driver's device a
// rule with a NoSchedule or NoExecute taint selects.
func drains(rules []*resourceapi.DeviceTaintRule) func(quota.DeviceID) bool {
	return func(id quota.DeviceID) bool {
		for _, r := range rules {
			if posture.KeepsWorkOff(r.Spec.Taint.Effect) && posture.RuleSelects(r, id.Driver, id.Pool, id.Device) {
				return true
			}
		}
		return false
	}
}

// consume takes (sign 1) or gives back (-1) a device's counters.
func (n *node) consume(d *device, sign int64) {
	for _, c := range d.api.ConsumesCounters {
		set := n.left[counterSetKey(d.id.Driver, d.id.Pool, c.CounterSet)]
		if set == nil {
			continue
		}
		for name, need := range c.Counters {
			if have, ok := set[name]; ok {
				set[name] = have - sign*need.Value.MilliValue()
			}
		}
	}
}

// fits reports whether a device's counters fit in what is left; a counter
// its pool does not publish never fits, as for the scheduler.
func (n *node) fits(d *device) bool {
	for _, c := range d.api.ConsumesCounters {
		set := n.left[counterSetKey(d.id.Driver, d.id.Pool, c.CounterSet)]
		if set == nil {
			return false
		}
		for name, need := range c.Counters {
			if have, ok := set[name]; !ok || have < need.Value.MilliValue() {
				return false
			}
		}
	}
	return true
}

func (d *device) free() bool { return !d.taken && d.healthy && !d.used }

func (d *device) match(ctx context.Context, i int, r *Request) bool {
	m, ok := d.known[d.keys[i]]
	if !ok {
		m = quota.Matches(ctx, &quota.Device{ID: d.id, Basic: *d.api}, r.Selectors)
		if ctx.Err() == nil { // a cut-short evaluation is not remembered
			d.known[d.keys[i]] = m
		}
	}
	return m
}

// groupOf is the device's value of the alignment attribute; false when it
// publishes none (it cannot be part of an aligned instance).
func groupOf(d *resourceapi.Device, attr resourceapi.FullyQualifiedName) (string, bool) {
	if attr == "" {
		return "", true
	}
	a, ok := d.Attributes[resourceapi.QualifiedName(attr)]
	if !ok {
		return "", false
	}
	switch {
	case a.StringValue != nil:
		return "s:" + *a.StringValue, true
	case a.IntValue != nil:
		return "i:" + strconv.FormatInt(*a.IntValue, 10), true
	case a.VersionValue != nil:
		return "v:" + *a.VersionValue, true
	case a.BoolValue != nil:
		return "b:" + strconv.FormatBool(*a.BoolValue), true
	}
	return "", false
}

// count takes instances of q from the node until none fits.
func (n *node) count(ctx context.Context, q Query) int {
	if len(q.Requests) == 0 {
		return 0
	}
	var groups []string
	for _, d := range n.devs {
		if d.grouped && !slices.Contains(groups, d.group) {
			groups = append(groups, d.group)
		}
	}
	sort.Strings(groups)
	all := slices.ContainsFunc(q.Requests, func(r Request) bool { return r.All })
	total := 0
	for {
		placed := false
		for _, g := range groups {
			if n.placeOne(ctx, q, g) {
				placed = true
				break
			}
		}
		if !placed {
			return total
		}
		total++
		if all {
			return total // the node's matching devices are all taken
		}
	}
}

// placeOne takes one instance from the devices of group g, or nothing.
func (n *node) placeOne(ctx context.Context, q Query, g string) bool {
	var picked []*device
	undo := func() bool {
		for _, d := range picked {
			d.used = false
			n.consume(d, -1)
		}
		return false
	}
	take := func(d *device) {
		d.used = true
		n.consume(d, 1)
		picked = append(picked, d)
	}
	for i := range q.Requests {
		r := &q.Requests[i]
		got := 0
		for _, d := range n.devs {
			if !r.All && got == r.Count {
				break
			}
			if !d.healthy || !d.match(ctx, i, r) {
				continue
			}
			inGroup := d.grouped && d.group == g
			if !d.free() || !n.fits(d) || !inGroup {
				if r.All {
					return undo() // every matching device is the instance's, or none
				}
				continue
			}
			take(d)
			got++
		}
		if got == 0 || (!r.All && got < r.Count) {
			return undo()
		}
	}
	return true
}
