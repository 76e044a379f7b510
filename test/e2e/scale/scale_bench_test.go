package scale

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// BenchmarkScale measures the real kube-scheduler placing one-device pods
// on kwok nodes of 8 x H100 each, whose slices our plugin code publishes,
// for every mode of issue 14, at each node count of $SCALE_NODES (default
// "100,500"), and prints a table with each mode's pods/s as a ratio to the
// no-claim baseline and to whole GPUs measured in the same run.
//
//	make bench-scale
//	(= E2E_REQUIRED=1 go test ./test/e2e/scale -run '^$' -bench Scale -benchtime 1x -timeout 3h)
func BenchmarkScale(b *testing.B) {
	for _, n := range envInts(b, "SCALE_NODES", []int{100, 500}) {
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			r := startRunner(b, n, podsFor(b, n))
			results := r.runModes(b, modes())
			b.Run("steady-state-dynamic-mig-1g", func(b *testing.B) {
				var res result
				for b.Loop() {
					res = r.steady(b, steadyLoad{rate: steadyRate(results), duration: time.Minute, lifetime: 10 * time.Second})
				}
				report(b, res)
				results = append(results, res)
			})
			took, writes := r.restart(b)
			b.Logf("%d nodes x 8 GPUs, %d pods per mode:\n%s\nrestart of all %d publishers (%d slices): %.1fs, %d slice writes in the 5 s after",
				n, r.pods, table(results), n, r.fleet.Slices(), took.Seconds(), writes)
		})
	}
}

// TestScaleSmoke runs every mode of the benchmark at a small scale (8
// nodes, 24 pods each, a few seconds of steady state), so that `make e2e`
// keeps the benchmark working: every pod must be bound, every claim
// allocated on its pod's node and no device given twice, and restarted
// publishers must not write unchanged slices again.
func TestScaleSmoke(t *testing.T) {
	const nodes = 8
	r := startRunner(t, nodes, 3*nodes)
	var results []result
	for _, m := range modes() {
		results = append(results, r.run(t, m))
	}
	results = append(results, r.steady(t, steadyLoad{rate: steadyRate(results), duration: 3 * time.Second, lifetime: time.Second}))
	if _, writes := r.restart(t); writes != 0 {
		t.Errorf("restarting the publishers of unchanged slices wrote %d slices, want 0", writes)
	}
	t.Logf("%d nodes, %d pods per mode (figures mean little at this size):\n%s", nodes, r.pods, table(results))
}

// steadyRate is the steady state's creation rate: half what dynamic MIG
// 1g (or, in a run without it, with four profiles) reached in the same
// run, so the churn measures time-to-bind below capacity rather than a
// growing queue.
func steadyRate(results []result) float64 {
	for _, mode := range []string{"dynamic-mig-1g", "dynamic-mig-1g-four-profiles"} {
		for _, r := range results {
			if r.mode == mode {
				return max(1, r.podsPerSec/2)
			}
		}
	}
	return 1
}

// runModes runs each mode as a sub-benchmark on r and returns their
// results in order.
func (r *runner) runModes(b *testing.B, ms []mode) []result {
	var results []result
	for _, m := range ms {
		b.Run(m.name, func(b *testing.B) {
			var res result
			for b.Loop() {
				res = r.run(b, m)
			}
			report(b, res)
			results = append(results, res)
		})
	}
	return results
}

func report(b *testing.B, res result) {
	b.ReportMetric(res.podsPerSec, "pods/s")
	b.ReportMetric(float64(res.p50.Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(res.p99.Microseconds())/1000, "p99-ms")
	b.ReportMetric(float64(res.slices), "slices")
}

// table renders the results as markdown, with pods/s as ratios to the
// baseline (no claim) and to whole GPUs of the same run.
func table(results []result) string {
	byMode := map[string]result{}
	for _, r := range results {
		byMode[r.mode] = r
	}
	ratio := func(r result, base string) string {
		b, ok := byMode[base]
		if !ok || b.podsPerSec == 0 {
			return "-"
		}
		return fmt.Sprintf("%.2f", r.podsPerSec/b.podsPerSec)
	}
	var sb strings.Builder
	sb.WriteString("| mode | pods | pods/s | p50 ms | p99 ms | / no-claim | / whole-gpu | slices | publish s |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range results {
		fmt.Fprintf(&sb, "| %s | %d | %.1f | %.0f | %.0f | %s | %s | %d | %.1f |\n", r.mode, r.pods, r.podsPerSec,
			ms(r.p50), ms(r.p99), ratio(r, "no-claim"), ratio(r, "whole-gpu"), r.slices, r.publish.Seconds())
	}
	return sb.String()
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// podsFor is the pods per mode at n nodes: $SCALE_PODS (default 5,000) but
// at most 6 per node, three quarters of the whole GPUs, so that every mode
// fits and whole GPUs are measured short of a full cluster.
func podsFor(tb testing.TB, n int) int {
	want := 5000
	if v := os.Getenv("SCALE_PODS"); v != "" {
		var err error
		if want, err = strconv.Atoi(v); err != nil || want <= 0 {
			tb.Fatalf("SCALE_PODS=%q: want a positive number", v)
		}
	}
	return min(want, 6*n)
}

func envInts(tb testing.TB, name string, def []int) []int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	var out []int
	for f := range strings.SplitSeq(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			tb.Fatalf("%s=%q: want positive numbers separated by commas", name, v)
		}
		out = append(out, n)
	}
	return out
}
