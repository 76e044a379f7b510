package peer

import (
	"strings"
	"testing"
	"time"
)

func TestPercentileNearestRank(t *testing.T) {
	var s []time.Duration
	for i := 100; i >= 1; i-- { // unsorted on purpose
		s = append(s, time.Duration(i)*time.Millisecond)
	}
	for _, c := range []struct {
		q    float64
		want time.Duration
	}{{0.5, 50 * time.Millisecond}, {0.99, 99 * time.Millisecond}, {1, 100 * time.Millisecond}} {
		if got := percentile(s, c.q); got != c.want {
			t.Errorf("percentile(1..100 ms, %v) = %v, want %v", c.q, got, c.want)
		}
	}
	if got := percentile(s[:1], 0.99); got != 100*time.Millisecond {
		t.Errorf("percentile of one sample = %v, want that sample", got)
	}
	if s[0] != 100*time.Millisecond {
		t.Error("percentile sorted its caller's samples")
	}
}

func TestTableRatioIsTheirsOverOurs(t *testing.T) {
	ours, theirs := &driver{label: "gpuaas"}, &driver{label: "NVIDIA"}
	tab := &table{drivers: []*driver{ours, theirs}}
	tab.setLatency("prepare", ours, []time.Duration{2 * time.Millisecond})
	tab.setLatency("prepare", theirs, []time.Duration{5 * time.Millisecond})
	tab.set("slices", ours, "2 / 8", 0)
	tab.set("slices", theirs, "1 / 8", 0)
	var out strings.Builder
	tab.print(&out)
	for _, want := range []string{
		"| row | gpuaas | NVIDIA | NVIDIA / gpuaas |",
		"| prepare | 2.00 ms / 2.00 ms | 5.00 ms / 5.00 ms | 2.50x / 2.50x |",
		"| slices | 2 / 8 | 1 / 8 |  |",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
}
