package mig_test

import (
	"strings"
	"testing"
)

// Of every dynamic MIG device, first fit should reach only the lower 3g
// placement after every GPU's others: it is the only place of 4g, and 3g +
// 4g fill a GPU. Deferring anything else spreads small claims over every
// GPU (BenchmarkMIGPacking in pkg/mig/packing measured it).
func TestDeferredIsTheLowerHalfOf3g(t *testing.T) {
	for _, product := range products {
		l := layout(t, gpu(machine(t, product), 0))
		n := 0
		for _, part := range l.Partitions {
			want := strings.HasPrefix(part.Profile.Name, "3g.") && part.Placement.Start == 0
			if got := l.Deferred(part); got != want {
				t.Errorf("%s: %s at %+v deferred: %v, want %v", product, part.Profile.Name, part.Placement, got, want)
			}
			if want {
				n++
			}
		}
		if n != 1 {
			t.Errorf("%s: %d lower 3g placements, want 1", product, n)
		}
	}
}

// Where the node configuration does not offer 4g, nothing pairs with the
// upper 3g, and nothing is deferred: spreading 3g claims over the GPUs
// would only take whole GPUs from 7g.
func TestNothingDeferredWithout4g(t *testing.T) {
	l := layout(t, gpu(machine(t, h100_80), 0))
	if err := l.Offer([]string{"1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb"}); err != nil {
		t.Fatal(err)
	}
	for _, part := range l.Partitions {
		if l.Deferred(part) {
			t.Errorf("%s at %+v deferred without 4g offered", part.Profile.Name, part.Placement)
		}
	}
}
