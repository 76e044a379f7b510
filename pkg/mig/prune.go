package mig

import (
	"slices"
	"strconv"
	"strings"
	"sync"

	resourceapi "k8s.io/api/resource/v1"
)

// Pruning the counters that decide nothing.
//
// A dynamic MIG GPU's counter set describes everything its partitions
// share (memory slices by position, compute slices, multiprocessors,
// memory, engines, instance caps), but on a given GPU most of those never
// refuse a packing that the others allow: seven 1g slices always fit in
// seven compute slices once their memory slices do. The scheduler pays for
// every counter of every device on every node it looks at, for every pod
// (the allocator converts and validates each device's consumption, and
// checks each candidate against every counter of the pool: in the scale
// benchmark that was most of its time on dynamic MIG nodes), so a counter
// that decides nothing is pure cost.
//
// pruneCounters drops such counters from the layout: it walks every
// packing of the GPU's partitions (and the whole GPU) that the full set
// allows, then drops one counter at a time, keeping the drop only when the
// packings stay exactly the same. Dropping a constraint can only admit
// more packings, so an equal count means an equal set: the scheduler
// allows exactly what it allowed before. The memory-slice counters (the
// placement, which posture reads) and gpu-milliunits (what Kueue charges)
// are always kept. The result depends only on the GPU's profiles, so it is
// computed once per kind of GPU.

// alwaysKept reports whether a counter is published whether or not it
// decides a packing.
func alwaysKept(name string) bool {
	return name == CounterGPUMilliunits || strings.HasPrefix(name, "memory-slice-")
}

// pruned caches the counters to drop by GPU kind (the counter set and
// every partition's consumption, as a key).
var pruned sync.Map // string -> []string

// pruneCounters removes from l the counters that decide no packing.
func pruneCounters(l *Layout) {
	key := layoutKey(l)
	drop, ok := pruned.Load(key)
	if !ok {
		drop, _ = pruned.LoadOrStore(key, redundantCounters(l))
	}
	for _, name := range drop.([]string) {
		delete(l.CounterSet.Counters, name)
		dropCounter(l.WholeGPU, name)
		for i := range l.Partitions {
			dropCounter(l.Partitions[i].Device.ConsumesCounters, name)
		}
	}
}

func dropCounter(consumes []resourceapi.DeviceCounterConsumption, name string) {
	for _, c := range consumes {
		delete(c.Counters, name)
	}
}

// packingModel is a layout as integer vectors over its counters: what the
// set holds and what each item (a partition, or the whole GPU) consumes.
type packingModel struct {
	names []string
	have  []int64
	items [][]int64
}

func modelOf(l *Layout) packingModel {
	m := packingModel{}
	for name := range l.CounterSet.Counters {
		m.names = append(m.names, name)
	}
	slices.Sort(m.names)
	for _, name := range m.names {
		c := l.CounterSet.Counters[name]
		m.have = append(m.have, c.Value.Value())
	}
	vector := func(consumes []resourceapi.DeviceCounterConsumption) []int64 {
		v := make([]int64, len(m.names))
		for _, c := range consumes {
			for i, name := range m.names {
				if q, ok := c.Counters[name]; ok {
					v[i] += q.Value.Value()
				}
			}
		}
		return v
	}
	m.items = append(m.items, vector(l.WholeGPU))
	for _, p := range l.Partitions {
		m.items = append(m.items, vector(p.Device.ConsumesCounters))
	}
	return m
}

// redundantCounters are the counters of l that can go, found greedily in
// name order.
func redundantCounters(l *Layout) []string {
	m := modelOf(l)
	active := make([]bool, len(m.names))
	for i := range active {
		active[i] = true
	}
	full := m.count(active, -1)
	var drop []string
	for i, name := range m.names {
		if alwaysKept(name) {
			continue
		}
		active[i] = false
		if m.count(active, full) == full {
			drop = append(drop, name)
		} else {
			active[i] = true
		}
	}
	return drop
}

// count is how many packings (sets of items that fit together, the empty
// one included) the active counters allow; it stops early past limit
// (when limit >= 0), as the caller only asks whether it stayed equal.
func (m packingModel) count(active []bool, limit int) int {
	used := make([]int64, len(m.names))
	n := 0
	var walk func(from int)
	walk = func(from int) {
		n++
		for i := from; i < len(m.items) && (limit < 0 || n <= limit); i++ {
			if !m.fits(m.items[i], used, active) {
				continue
			}
			add(used, m.items[i], 1)
			walk(i + 1)
			add(used, m.items[i], -1)
		}
	}
	walk(0)
	return n
}

func (m packingModel) fits(item, used []int64, active []bool) bool {
	for j, v := range item {
		if active[j] && v > 0 && used[j]+v > m.have[j] {
			return false
		}
	}
	return true
}

func add(used, item []int64, sign int64) {
	for j, v := range item {
		used[j] += sign * v
	}
}

// layoutKey identifies what the pruning depends on: the counter set's
// amounts and each item's consumption (names carry the GPU's index, so
// they are left out: all GPUs of a kind share the key).
func layoutKey(l *Layout) string {
	m := modelOf(l)
	var b strings.Builder
	b.WriteString(strings.Join(m.names, ","))
	for _, v := range append([][]int64{m.have}, m.items...) {
		b.WriteByte('|')
		for _, x := range v {
			b.WriteString(strconv.FormatInt(x, 10))
			b.WriteByte(',')
		}
	}
	return b.String()
}
