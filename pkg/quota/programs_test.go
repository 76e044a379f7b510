package quota

import (
	"context"
	"fmt"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
)

// longSelector is a distinct selector of about n bytes that matches every
// device of ours.
func longSelector(salt, n int) string {
	var b strings.Builder
	fmt.Fprintf(&b, `device.driver == "gpu.gpuaas.io" || device.attributes["gpu.gpuaas.io"].index == %d`, -salt-1)
	for i := 0; b.Len() < n; i++ {
		fmt.Fprintf(&b, ` || device.attributes["gpu.gpuaas.io"].index == %d`, -i-1000)
	}
	return b.String()
}

// Issue 36: 300 distinct selectors of 10 KiB grew the heap by 75 MiB in the
// compile cache of 1000 entries. The cache is bounded by the length of the
// expressions it holds.
func TestCompiledSelectorsAreBoundedByLength(t *testing.T) {
	c := newProgramCache(100, 8<<10)
	for i := range 20 {
		if res := c.get(t.Context(), longSelector(i, 1<<10)); res.Error != nil {
			t.Fatal(res.Error)
		}
		if n, length := c.size(); length > 8<<10 {
			t.Fatalf("after %d selectors of 1 KiB the cache holds %d of %d bytes, over its 8 KiB", i+1, n, length)
		}
	}
	if n, _ := c.size(); n < 4 {
		t.Errorf("the cache holds %d selectors of 1 KiB in 8 KiB, want several", n)
	}
	if res := c.get(t.Context(), longSelector(99, 9<<10)); res.Error != nil {
		t.Fatal(res.Error)
	}
	if _, length := c.size(); length > 8<<10 {
		t.Errorf("one selector longer than the cache's bound was kept: %d bytes", length)
	}
}

// Compiling is not metered in CEL's cost units, and a claim of 32 requests
// of 32 selectors of 10 KiB made the controller compile 10 MiB of text.
// A selector the cache does not hold charges the claim's budget by its
// length, so the pricing stops after a few.
func TestCompilingNewSelectorsSpendsTheBudget(t *testing.T) {
	p := testPricer()
	var reqs []resourceapi.DeviceRequest
	for i := range 32 {
		reqs = append(reqs, exact(fmt.Sprintf("r%d", i), "any", 1, withSelector(longSelector(1000+i, 10<<10))))
	}
	spec := &resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: reqs}}
	_, before := celPrograms.size()
	ctx, stop := WithCELBudget(context.Background(), MaxCELCostPerClaim)
	defer stop()
	got := p.Unpriced(ctx, spec)
	_, after := celPrograms.size()
	if len(got) == 0 || !got[0].OverBudget {
		t.Fatalf("32 new selectors of 10 KiB: unpriced %+v, want refused for the CEL budget", got)
	}
	if compiled := (after - before) / (10 << 10); compiled > 8 {
		t.Errorf("compiled %d of the 32 selectors, want the budget to stop it within 8", compiled)
	}
}
