package admission

import (
	"context"
	"errors"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Issue 36 route 4: callers waiting for their book's group commit did not
// watch their own deadline. One claim whose selectors took 30 s to price
// held the commit, and a peer's ordinary claim was answered after 29.7 s,
// long after the API server had failed it closed at 5 s, and its
// reservation was written anyway. A waiting caller now gives up with its
// request, leaves the queue, and nothing is reserved for it.
func TestAWaitingAdmissionEndsWithItsRequest(t *testing.T) {
	acct, c := newAccountant(t, append(world(t), ns("a", nil), teamQuota("team-a", "a", "10"))...)
	if adm, err := acct.Admit(ctx(t), claim("a", "first", "h100", 1), false); err != nil || !adm.Allowed {
		t.Fatalf("first claim: %+v, %v", adm, err)
	}
	tenant, _, err := acct.tenantOf(ctx(t), "a")
	if err != nil {
		t.Fatal(err)
	}
	b := acct.ledger.bookFor(tenant)
	b.turn <- struct{}{} // a long group commit of someone else's claim
	released := make(chan struct{})
	go func() { // released in any case, so that the old code ends too
		time.Sleep(5 * time.Second)
		<-b.turn
		close(released)
	}()
	waiting, cancel := context.WithTimeout(ctx(t), 100*time.Millisecond)
	defer cancel()
	adm, err := acct.Admit(waiting, claim("a", "peer", "h100", 1), false)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a caller whose request ended while its book was busy got %+v, %v; want its deadline's error", adm, err)
	}
	<-released
	if adm, err := acct.Admit(ctx(t), claim("a", "next", "h100", 1), false); err != nil || !adm.Allowed {
		t.Fatalf("next claim: %+v, %v", adm, err)
	}
	var cm corev1.ConfigMap
	if err := c.Get(ctx(t), client.ObjectKey{Namespace: "gpuaas", Name: "gpuaas-quota-tenant-team-a"}, &cm); err != nil {
		t.Fatal(err)
	}
	entries, err := decodeBook(&cm)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Name == "peer" {
			t.Errorf("a reservation was written for the claim whose caller had given up: %+v", e)
		}
	}
}
