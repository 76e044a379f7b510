package mig_test

import (
	"maps"
	"slices"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpuaas/gpu-dra-driver/pkg/mig"
)

// The counters pruneCounters drops decide nothing: on every mock GPU the
// published (pruned) counters allow exactly the packings of partitions and
// whole GPU that the full set allows, while fewer counters remain, the
// placement (memory-slice) and Kueue (gpu-milliunits) counters among them.
func TestPrunedCountersAllowTheSamePackings(t *testing.T) {
	for _, product := range products {
		d := gpu(machine(t, product), 0)
		full, err := mig.BuildDynamicUnpruned(parentOf(t, d), profiles(t, d), true)
		if err != nil {
			t.Fatal(err)
		}
		pruned := layout(t, d)
		want, got := packings(full), packings(pruned)
		if len(want) < 100 {
			t.Fatalf("%s: only %d packings: the walk is broken", product, len(want))
		}
		if !slices.Equal(want, got) {
			t.Errorf("%s: the pruned counters allow %d packings, the full set %d; first difference: %s",
				product, len(got), len(want), firstDifference(want, got))
		}
		kept := slices.Sorted(maps.Keys(pruned.CounterSet.Counters))
		if len(kept) >= len(full.CounterSet.Counters) {
			t.Errorf("%s: nothing pruned (%d counters)", product, len(kept))
		}
		for name := range full.CounterSet.Counters {
			if _, ok := pruned.CounterSet.Counters[name]; !ok && (strings.HasPrefix(name, "memory-slice-") || name == mig.CounterGPUMilliunits) {
				t.Errorf("%s: %s pruned, want it kept", product, name)
			}
		}
		t.Logf("%s: %d packings; %d of %d counters kept: %v", product, len(want), len(kept), len(full.CounterSet.Counters), kept)
	}
}

// packings lists, sorted, every set of the layout's devices (the whole GPU
// and the partitions) whose consumption fits in its counter set.
func packings(l mig.Layout) []string {
	devs := []resourceapi.Device{{Name: "whole", ConsumesCounters: l.WholeGPU}}
	for _, p := range l.Partitions {
		devs = append(devs, p.Device)
	}
	var out []string
	var walk func(from int, picked []resourceapi.Device)
	walk = func(from int, picked []resourceapi.Device) {
		names := make([]string, len(picked))
		for i, d := range picked {
			names[i] = d.Name
		}
		out = append(out, strings.Join(names, "+"))
		for i := from; i < len(devs); i++ {
			if next := append(slices.Clone(picked), devs[i]); fits(l.CounterSet, next...) {
				walk(i+1, next)
			}
		}
	}
	walk(0, nil)
	slices.Sort(out)
	return out
}

func firstDifference(a, b []string) string {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return a[i] + " / " + b[i]
		}
	}
	return "(one list is a prefix of the other)"
}

// BenchmarkPruneCounters is the one-time cost per kind of GPU of finding
// the counters that decide nothing (then cached for the process).
//
//	go test -run '^$' -bench PruneCounters ./pkg/mig/
func BenchmarkPruneCounters(b *testing.B) {
	d := gpu(machine(b, h100_80), 0)
	l, err := mig.BuildDynamicUnpruned(parentOf(b, d), profiles(b, d), true)
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if len(mig.RedundantCounters(&l)) == 0 {
			b.Fatal("nothing to prune")
		}
	}
}
