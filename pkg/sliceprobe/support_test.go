package sliceprobe

import (
	"slices"
	"testing"
)

// TestLocked (issue 57): what Kubernetes 1.38 cannot drop, its gates for
// partitionable devices and device taints locked on, is everything but
// consumable capacity (GA, but it can be turned off); an older or unknown
// version can drop everything (Least).
func TestLocked(t *testing.T) {
	for _, v := range []string{"v1.38.0", "v1.38.0-beta.0", "v1.39.2"} {
		got := Locked(v)
		if got.Counters != CountersInOwnSlices || !got.Taints || !got.TaintEffectNone || got.MaxTaints != Full.MaxTaints {
			t.Errorf("%s: %+v, want counters in slices of their own and taints kept (locked on)", v, got)
		}
		if gaps := got.Gaps(); !slices.Equal(gaps, []Gap{gapCapacity}) {
			t.Errorf("%s: gaps %v, want only consumable capacity (it can be turned off)", v, gaps)
		}
	}
	for _, v := range []string{"v1.37.2", "v1.34.4", "", "devel", "v2.0.0"} {
		if got := Locked(v); got != Least {
			t.Errorf("%q: %+v, want Least", v, got)
		}
	}
}
