package quota

import (
	"fmt"
	"strings"
	"testing"
)

// Issue 36 route 5: the memo kept every priced request shape, dry runs
// included, keyed by the full selector text, until the catalog changed:
// 300 dry-run claims of about 290 kB each grew the heap by 130 MiB, and the
// chart's controller is limited to 256 Mi. Dry runs are priced but not
// remembered, and what is remembered is bounded in entries and in bytes
// (keys are hashes, not the tenant's text).
func TestDryRunShapesAreNotRemembered(t *testing.T) {
	p := testPricer()
	big := strings.Repeat("x", 290<<10)
	for i := range 3 {
		spec := claimSpec(exact("gpu", "any", 1, withSelector(fmt.Sprintf("true // %d %s", i, big))))
		p.ClaimCost(WithDryRun(t.Context()), spec)
	}
	if n, bytes := p.memoSize(); n != 0 || bytes != 0 {
		t.Errorf("after three dry runs the memo holds %d shapes in %d key bytes, want none", n, bytes)
	}
	spec := claimSpec(exact("gpu", "any", 1, withSelector("true // "+big)))
	p.ClaimCost(t.Context(), spec)
	if n, bytes := p.memoSize(); n != 1 || bytes > 64 {
		t.Errorf("after a real create of a 290 kB shape the memo holds %d shapes in %d key bytes, want 1 in a hash's", n, bytes)
	}
}

func TestMemoIsBounded(t *testing.T) {
	p := testPricer()
	for i := range MaxRememberedShapes + 50 {
		p.ClaimCost(t.Context(), claimSpec(exact("gpu", "any", 1, withSelector(fmt.Sprintf("true // %d", i)))))
	}
	if n, _ := p.memoSize(); n > MaxRememberedShapes {
		t.Errorf("the memo holds %d shapes, at most %d allowed", n, MaxRememberedShapes)
	}
	// A remembered shape still prices as a fresh one.
	spec := claimSpec(exact("gpu", "gpu", 2, withSelector("true")))
	if a, b := p.ClaimCost(t.Context(), spec), testPricer().ClaimCost(t.Context(), spec); !sameCharge(a, b) {
		t.Errorf("a full memo prices %s, a fresh pricer %s", a, b)
	}
}
