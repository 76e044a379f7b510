package admission

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller/internal/testworld"
	"github.com/gpuaas/gpu-dra-driver/pkg/quota"
)

// holdPricing has the accountant's recounts stall on the claims of one
// namespace, as a claim of selectors near the API server's limit does,
// until released or the pricing's context ends.
func holdPricing(acct *Accountant, namespace string) (started, release chan struct{}) {
	started, release = make(chan struct{}), make(chan struct{})
	var once sync.Once
	acct.beforePricing = func(ctx context.Context, c *resourceapi.ResourceClaim) {
		if c.Namespace != namespace {
			return
		}
		once.Do(func() { close(started) })
		select {
		case <-release:
		case <-ctx.Done():
		}
	}
	return started, release
}

// Issue 55 route 5: a tenant whose claims are slow to price (selectors near
// the API server's limit, each admitted within its budget) is recounted
// after a catalog change; that recount must not hold up the admission of a
// tenant of another cohort, which waited on the accountant-wide claims lock
// the recount priced under.
func TestSlowRecountDoesNotStallAnotherTenant(t *testing.T) {
	objs := append(world(t), ns("slow", nil), ns("a", nil),
		tenantQuota("team-slow", 0, gpuaas.TenantQuotaSpec{Namespaces: []string{"slow"}, Limits: gpuaas.QuotaLimits{GpuUnits: qty("4")}}),
		tenantQuota("team-a", 1, gpuaas.TenantQuotaSpec{Namespaces: []string{"a"}, Limits: gpuaas.QuotaLimits{GpuUnits: qty("2")}}),
		claim("slow", "heavy", "h100", 1), claim("a", "held", "mig-1g", 1))
	acct, _ := newAccountant(t, objs...)
	started, release := holdPricing(acct, "slow")
	stalled := make(chan error, 1)
	go func() { // the quota reconciler's status of team-slow, after the catalog changed
		_, err := acct.Report(ctx(t), "team-slow")
		stalled <- err
	}()
	<-started
	admitsWhileStalled(t, acct, release, "team-a's admission waited for the recount of team-slow's claims")
	if err := <-stalled; err != nil {
		t.Fatal(err)
	}
}

// dearToCompile is a claim of one 1g slice whose selector, distinct by
// salt, costs about 640,000 CEL units to compile (compileCostPerByte per
// byte of its 10,000) and little to evaluate.
func dearToCompile(namespace, name, salt string) *resourceapi.ResourceClaim {
	c := claim(namespace, name, "mig-1g", 1)
	expr := fmt.Sprintf("%q != %q", salt, strings.Repeat("x", 10_000))
	c.Spec.Devices.Requests[0].Exactly.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: expr}}}
	return c
}

// Issue 55 route 5, within a cohort: a decision holds its cohort's lock
// from the recount to the verdict, so a member's claims slow to price held
// every peer's admission as long as they took. One sync prices within one
// budget; what it leaves counts at its worst case, is not remembered, and
// the next sync prices on from there.
func TestCohortRecountIsBoundedAndPricesOn(t *testing.T) {
	salt := fmt.Sprint(time.Now().UnixNano()) // compiled by no other test of this process
	objs := append(world(t), ns("slow", nil), ns("b", nil),
		tenantQuota("team-slow", 0, gpuaas.TenantQuotaSpec{Namespaces: []string{"slow"}, Cohort: "x", Limits: gpuaas.QuotaLimits{GpuUnits: qty("4")}}),
		tenantQuota("team-b", 1, gpuaas.TenantQuotaSpec{Namespaces: []string{"b"}, Cohort: "x", Limits: gpuaas.QuotaLimits{GpuUnits: qty("4")}}))
	for i := range 3 {
		objs = append(objs, dearToCompile("slow", fmt.Sprint("dear-", i), fmt.Sprint(salt, "-", i)))
	}
	acct, _ := newAccountant(t, objs...)
	acct.recountBudget = 1_000_000                                   // one of the claims, not two
	adm, err := acct.Admit(ctx(t), claim("b", "c", "h100", 1), true) // the peer's decision syncs the cohort
	if err != nil || !adm.Allowed {
		t.Fatalf("team-b's claim: %+v, %v; want admitted", adm, err)
	}
	acct.claimsMu.Lock()
	priced, counted := len(acct.charges), acct.nsUsage["slow"].total[0]
	acct.claimsMu.Unlock()
	// One claim priced (1/7), two at their worst case: a whole GPU each.
	if want := quota.NewUnits(15, 7); priced != 1 || counted.Cmp(want) != 0 {
		t.Errorf("the peer's sync priced %d of team-slow's claims and counted %s GPU units; want 1 priced within the budget, "+
			"the others at their worst case (%s) and not remembered", priced, counted, want)
	}
	r, err := acct.Report(ctx(t), "team-slow")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := r.Usage.Total().Units, quota.NewUnits(3, 7); got.Cmp(want) != 0 {
		t.Errorf("team-slow after a second sync: %s GPU units, want %s (the second prices on from the first)", got, want)
	}
}

// Issue 52 build 2: a catalog change re-prices only what it can move. A
// claim allocated on node-a is charged from node-a's devices and the
// classes: an update of node-b's slice (a device added) must not price it
// again, an update of node-a's must, and an unallocated claim, whose worst
// case any node can move, is priced again on either.
func TestAnotherPoolsUpdateKeepsAllocatedClaimPrices(t *testing.T) {
	objs := append(world(t), ns("a", nil), teamQuota("team-a", "a", "4"),
		allocatedTo(claim("a", "on-a", "h100", 1), "node-a", "gpu-0"), claim("a", "waiting", "mig-1g", 1))
	acct, c := newAccountant(t, objs...)
	var mu sync.Mutex
	priced := map[string]int{}
	acct.beforePricing = func(_ context.Context, claim *resourceapi.ResourceClaim) {
		mu.Lock()
		priced[claim.Name]++
		mu.Unlock()
	}
	recount := func() map[string]int {
		t.Helper()
		mu.Lock()
		clear(priced)
		mu.Unlock()
		if _, err := acct.Report(ctx(t), "team-a"); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		defer mu.Unlock()
		return maps.Clone(priced)
	}
	update := func(node string, d resourceapi.Device) {
		t.Helper()
		var s resourceapi.ResourceSlice
		if err := c.Get(ctx(t), client.ObjectKey{Name: node + "-slice"}, &s); err != nil {
			t.Fatal(err)
		}
		s.Spec.Devices = append(s.Spec.Devices, d)
		if err := c.Update(ctx(t), &s); err != nil {
			t.Fatal(err)
		}
		acct.InvalidateCatalog() // as CatalogHandler does: the devices changed
	}
	recount()
	d := mig1g(7)
	d.Name = "gpu-1-mig-1g-0"
	update("node-b", d)
	if got := recount(); got["on-a"] != 0 || got["waiting"] != 1 {
		t.Errorf("after node-b's update, priced again: %v; want only the unallocated claim (the one on node-a kept its price)", got)
	}
	update("node-a", testworld.WholeGPU(4))
	if got := recount(); got["on-a"] != 1 || got["waiting"] != 1 {
		t.Errorf("after node-a's update, priced again: %v; want both", got)
	}
}
