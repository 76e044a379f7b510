package quota

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
)

// heavySelector is a nested comprehension that every device evaluates in
// full, inner times 700 iterations: with inner 100, about half the API
// server's cost limit for one expression.
func heavySelector(inner, salt int) string {
	outer := make([]string, 700)
	for i := range outer {
		outer[i] = fmt.Sprint(i)
	}
	return fmt.Sprintf("[%s].all(x, [%s].all(y, x + y >= %d))", strings.Join(outer, ","), strings.Join(outer[:inner], ","), -salt)
}

// Issue 36: one claim's selectors could spend any CEL evaluation their
// author chose (32 selectors near the API server's limit took 30 s of the
// webhook). A claim is priced within its budget (MaxCELCostPerClaim in the
// webhook; a tenth of it here, to keep the test short under -race) and
// refused as unpriced past it, with a reason that says so; a lighter claim
// is priced as before.
func TestPricingStopsAtTheClaimsCELBudget(t *testing.T) {
	const budget = MaxCELCostPerClaim / 10
	p := testPricer()
	var heavy []resourceapi.DeviceRequest
	for i := range 8 {
		heavy = append(heavy, exact(fmt.Sprintf("r%d", i), "any", 1, withSelector(heavySelector(10, i))))
	}
	spec := &resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: heavy}}
	ctx, stop := WithCELBudget(context.Background(), budget)
	defer stop()
	start := time.Now()
	got := p.Unpriced(ctx, spec)
	t.Logf("8 heavy selectors over %d devices: refused after %s", p.Inventory().Len(), time.Since(start))
	if len(got) == 0 || !got[0].OverBudget || !strings.Contains(got[0].Reason(), "cost more to evaluate") {
		t.Fatalf("unpriced %+v, want refused for the CEL budget", got)
	}
	light := &resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{
		exact("gpu", "any", 1, withSelector(heavySelector(1, 0)))}}}
	ctx2, stop2 := WithCELBudget(context.Background(), budget)
	defer stop2()
	if u := p.Unpriced(ctx2, light); len(u) != 0 {
		t.Errorf("one selector a tenth as heavy, within the budget: %+v, want priced", u)
	}
	if c := p.ClaimCost(ctx2, light); c.Units.Cmp(WholeUnits(1)) != 0 {
		t.Errorf("one selector a tenth as heavy priced %s, want a whole GPU", c.Units)
	}
}

// Issue 36: two dry runs of new, heavy shapes held both of the process's
// slots for new shapes, and another tenant's ordinary claim waited for
// them past its deadline. Dry runs have a slot of their own.
func TestDryRunsDoNotHoldTheClaimsSlots(t *testing.T) {
	p := testPricer()
	done := make(chan struct{})
	dryRuns, stop := context.WithCancel(t.Context())
	defer stop()
	for i := range 2 {
		go func() {
			defer func() { done <- struct{}{} }()
			heavy := &resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{
				exact("gpu", "any", 1, withSelector(heavySelector(30, 100+i)))}}}
			p.Unpriced(WithDryRun(dryRuns), heavy)
		}()
	}
	time.Sleep(100 * time.Millisecond) // both dry runs are evaluating
	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	claim := &resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{
		exact("gpu", "h100", 1, withSelector(typeIs("gpu")))}}}
	if u := p.Unpriced(ctx, claim); len(u) != 0 {
		t.Errorf("a claim's new shape while two dry runs priced theirs: %+v, want priced", u)
	}
	stop() // the dry runs' requests end
	<-done
	<-done
}
