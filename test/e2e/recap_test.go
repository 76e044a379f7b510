package e2e

import (
	"fmt"
	"strings"
	"sync"
	"testing"
)

// A failure recap repeats why a test failed as its very last lines. CI
// shows only the lines just above "--- FAIL", and the log tails that the
// node's, the chart's and Prometheus's cleanups print on a failure would
// otherwise push the reason out of that view (TestRealNodePrometheus failed
// in CI with nothing but kubelet lines to read).

// recaps holds each recapped test's failure reasons, by test.
var recaps sync.Map // *testing.T -> *failureRecap

type failureRecap struct {
	mu    sync.Mutex
	lines []string
}

// recapFailures registers t's recap. Call it first in the test: cleanups
// run last-registered first, so this one prints after every log tail.
func recapFailures(t *testing.T) {
	r := &failureRecap{}
	recaps.Store(t, r)
	t.Cleanup(func() {
		recaps.Delete(t)
		r.mu.Lock()
		defer r.mu.Unlock()
		if t.Failed() && len(r.lines) > 0 {
			t.Logf("%s failed because:\n  - %s", t.Name(), strings.Join(r.lines, "\n  - "))
		}
	})
}

// recordFailure keeps msg for t's recap, if t has one.
func recordFailure(t *testing.T, msg string) {
	if r, ok := recaps.Load(t); ok {
		r := r.(*failureRecap)
		r.mu.Lock()
		defer r.mu.Unlock()
		r.lines = append(r.lines, msg)
	}
}

// recapErrorf is t.Errorf, kept for the recap.
func recapErrorf(t *testing.T, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	recordFailure(t, msg)
	t.Error(msg)
}

// recapFatalf is t.Fatalf, kept for the recap.
func recapFatalf(t *testing.T, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	recordFailure(t, msg)
	t.Fatal(msg)
}
