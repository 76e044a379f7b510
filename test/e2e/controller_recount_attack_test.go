package e2e

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuaas/gpu-dra-driver/pkg/quota/quotatest"
	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

// recountAttackClaims and recountAttackSelectors: the attacker's
// unallocated claims and the costly selectors of each, as in the
// in-process BenchmarkPeerAdmissionWhileRecounting.
const (
	recountAttackClaims    = 7
	recountAttackSelectors = 6
)

// TestControllerRecountDoesNotStallAnotherTenant (issue 55 route 5),
// against the real API server: a tenant's ServiceAccount holds seven
// unallocated claims of six costly selectors each (each claim admitted
// within its CEL budget), and the catalog changes without pause in a way
// that moves prices (a device of the node's slice comes and goes, as a
// node's plugin republishes), so the leader recounts that tenant's claims
// again and again. Meanwhile another tenant, as its own ServiceAccount,
// creates ordinary claims, each of a selector of its own. Before the fix a
// recount priced every claim under the accountant-wide claims lock with no
// budget but the caller's deadline, and the peer's admission waited behind
// it (20 s in process, past the chart's 5 s webhook timeout: the claim
// webhook fails closed). Every one of the peer's claims must be admitted;
// its latencies are logged, not asserted (BENCHMARKS.md).
func TestControllerRecountDoesNotStallAnotherTenant(t *testing.T) {
	rc := startController(t)
	ctx := framework.Context(t, 5*time.Minute)
	w := newAttackWorld(t, "recount-attack", recountAttackClaims)
	for i := range recountAttackClaims {
		c := gpuClaim(w.attackerNS, fmt.Sprint("dear-", i), w.class, 1)
		var sel []resourceapi.DeviceSelector
		for s := range recountAttackSelectors {
			sel = append(sel, resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{
				Expression: quotatest.DearSelector(fmt.Sprint(i, "-", s))}})
		}
		c.Spec.Devices.Requests[0].Exactly.Selectors = sel
		if _, err := w.attacker.Client.ResourceV1().ResourceClaims(w.attackerNS).Create(ctx, c, metav1.CreateOptions{}); err != nil {
			t.Fatalf("the attacker's claim %s, within its budget, refused: %v", c.Name, err)
		}
	}

	churn, stop := context.WithCancel(ctx)
	var changes int
	var churning sync.WaitGroup
	churning.Go(func() { changes = churnSlice(churn, w.slice) })
	time.Sleep(time.Second) // the churn is under way
	lat, refused := peerCreates(ctx, w.peer.Client.ResourceV1().ResourceClaims(w.peerNS), w.peerNS, w.class)
	stop()
	churning.Wait()
	t.Logf("price-moving slice changes meanwhile: %d; the peer's latencies (sorted): %v", changes, lat)
	if changes == 0 {
		t.Fatal("the slice did not change while the peer created its claims: the test proves nothing")
	}
	for _, r := range refused {
		t.Errorf("the peer's claim was refused while another tenant's claims were recounted: %s", r)
	}
	rc.alive(t)
}

// churnSlice takes the slice's last device out and puts it back, one
// update after the other, until ctx ends; it returns how many updates
// landed.
func churnSlice(ctx context.Context, slice *resourceapi.ResourceSlice) int {
	slices := cp.Client.ResourceV1().ResourceSlices()
	all := slice.Spec.Devices
	changes := 0
	for i := 0; ctx.Err() == nil; i++ {
		if i > 0 {
			time.Sleep(100 * time.Millisecond)
		}
		live, err := slices.Get(ctx, slice.Name, metav1.GetOptions{})
		if err != nil {
			continue // paced as an update: a failing Get does not spin
		}
		live.Spec.Devices = all
		if i%2 == 0 {
			live.Spec.Devices = all[:len(all)-1]
		}
		if _, err := slices.Update(ctx, live, metav1.UpdateOptions{}); err == nil {
			changes++
		}
	}
	return changes
}
