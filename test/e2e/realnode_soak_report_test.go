package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

// report checks the samples against the bounds, counts what leaked, and
// writes the soak's report to the log and to SOAK_REPORT.
func (s *soak) report(t *testing.T) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "## Soak: %v on the real node, %d cycles, %d pods churned\n\n", s.elapsed().Round(time.Second), s.cycles, s.pods)
	fmt.Fprintf(&b, "Faults injected (%d):\n\n", len(s.faults))
	for _, f := range s.faults {
		fmt.Fprintf(&b, "- %s\n", f)
	}
	violations := s.checkProcesses(&b)
	violations = append(violations, s.checkObjects(&b)...)
	leaks := s.leaks(t)
	fmt.Fprintf(&b, "\nLeaks after every pod and claim is gone: %d %v\n", len(leaks), leaks)
	fmt.Fprintf(&b, "Bounds exceeded after the warm-up (%v): %d %v\n", soakWarmUp, len(violations), violations)
	for _, sm := range s.samples {
		if sm.err != "" {
			fmt.Fprintf(&b, "- sample at %v could not read: %s\n", sm.at.Round(time.Second), sm.err)
		}
	}
	t.Log("\n" + b.String())
	if path := os.Getenv(soakReportEnv); path != "" {
		if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
			t.Error(err)
		}
	}
	for _, v := range append(leaks, violations...) {
		t.Error(v)
	}
}

// checkProcesses writes each process's first, last and largest sample,
// and returns the samples past the bounds: each measure of a process
// against its first sample after the warm-up and after its own first
// minute (a restarted process warms up too).
func (s *soak) checkProcesses(b *strings.Builder) []string {
	var violations []string
	fmt.Fprintf(b, "\n| process | samples | RSS MiB first / last / max | goroutines first / last / max | open fds first / last / max |\n|---|---|---|---|---|\n")
	for _, key := range s.processKeys() {
		var series []processSample
		var base *processSample
		for _, sm := range s.samples {
			p, ok := sm.processes[key]
			if !ok {
				continue
			}
			series = append(series, p)
			switch {
			case base == nil && sm.at >= soakWarmUp && sm.at >= p.born+soakSampleEvery:
				base = &p
			case base != nil:
				if p.rss > base.rss*soakRSSGrowth+soakRSSSlack {
					violations = append(violations, fmt.Sprintf("%s at %v: RSS %.1f MiB, warm-up %.1f MiB", key, sm.at.Round(time.Second), p.rss/(1<<20), base.rss/(1<<20)))
				}
				if p.goroutines > base.goroutines+soakGoroutinesGrowth {
					violations = append(violations, fmt.Sprintf("%s at %v: %.0f goroutines, warm-up %.0f", key, sm.at.Round(time.Second), p.goroutines, base.goroutines))
				}
				if p.fds > base.fds+soakFDsGrowth {
					violations = append(violations, fmt.Sprintf("%s at %v: %.0f open fds, warm-up %.0f", key, sm.at.Round(time.Second), p.fds, base.fds))
				}
			}
		}
		first, last := series[0], series[len(series)-1]
		mx := func(f func(processSample) float64) float64 {
			m := 0.0
			for _, p := range series {
				m = max(m, f(p))
			}
			return m
		}
		fmt.Fprintf(b, "| %s | %d | %.1f / %.1f / %.1f | %.0f / %.0f / %.0f | %.0f / %.0f / %.0f |\n", key, len(series),
			first.rss/(1<<20), last.rss/(1<<20), mx(func(p processSample) float64 { return p.rss })/(1<<20),
			first.goroutines, last.goroutines, mx(func(p processSample) float64 { return p.goroutines }),
			first.fds, last.fds, mx(func(p processSample) float64 { return p.fds }))
	}
	return violations
}

func (s *soak) processKeys() []string {
	var keys []string
	for _, sm := range s.samples {
		for key := range sm.processes {
			if !slices.Contains(keys, key) {
				keys = append(keys, key)
			}
		}
	}
	slices.Sort(keys)
	return keys
}

// checkObjects writes each kind's first, last and largest count, and
// returns what grew: slices and ConfigMaps must end as they were after
// the warm-up, claims at none, events within soakEventsPerPod per pod
// churned.
func (s *soak) checkObjects(b *strings.Builder) []string {
	fmt.Fprintf(b, "\n| objects | first / last / max |\n|---|---|\n")
	var warm, last map[string]int
	for _, sm := range s.samples {
		if len(sm.objects) == 0 {
			continue
		}
		if warm == nil && sm.at >= soakWarmUp {
			warm = sm.objects
		}
		last = sm.objects
	}
	kinds := []string{"resourceslices", "resourceclaims", "events", "configmaps", "release pods"}
	for _, kind := range kinds {
		first, mx := -1, 0
		for _, sm := range s.samples {
			if v, ok := sm.objects[kind]; ok {
				if first < 0 {
					first = v
				}
				mx = max(mx, v)
			}
		}
		fmt.Fprintf(b, "| %s | %d / %d / %d |\n", kind, first, last[kind], mx)
	}
	if warm == nil {
		return []string{"no sample of the API objects after the warm-up"}
	}
	var grew []string
	for _, kind := range []string{"resourceslices", "configmaps"} {
		if last[kind] != warm[kind] {
			grew = append(grew, fmt.Sprintf("%s: %d at the end, %d after the warm-up", kind, last[kind], warm[kind]))
		}
	}
	if last["resourceclaims"] != 0 {
		grew = append(grew, fmt.Sprintf("%d ResourceClaims at the end", last["resourceclaims"]))
	}
	if limit := warm["events"] + soakEventsPerPod*s.pods; last["events"] > limit {
		grew = append(grew, fmt.Sprintf("%d events at the end, more than %d per pod churned above the %d after the warm-up", last["events"], soakEventsPerPod, warm["events"]))
	}
	return grew
}

// leaks are what the plugin left on the node after every pod and claim
// of the soak is gone: claim records, CDI specs, MIG devices, GPUs in a
// compute mode of their own, MPS daemon pods.
func (s *soak) leaks(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, r := range entries(t, s.e.recordsDir) {
		out = append(out, "record "+r)
	}
	specs, _ := filepath.Glob(filepath.Join(s.e.n.CDIRoot, "k8s."+framework.DriverName+"-claim_*"))
	for _, spec := range specs {
		out = append(out, "CDI spec "+filepath.Base(spec))
	}
	gis, exclusive := mockMachineLeaks(t, s.e.h.stateDir)
	if gis > 0 {
		out = append(out, fmt.Sprintf("%d MIG devices", gis))
	}
	if exclusive > 0 {
		out = append(out, fmt.Sprintf("%d GPUs in a compute mode of their own", exclusive))
	}
	if n := len(s.samples); n > 0 {
		if extra := s.samples[n-1].objects["release pods"] - 2; extra > 0 {
			out = append(out, fmt.Sprintf("%d release pods besides the plugin and the controller (MPS daemons)", extra))
		}
	}
	return out
}
