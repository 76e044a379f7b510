package admission

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
)

// Two replicas share the API but not their memory: 50 claims admitted at
// once, alternating between them, against room for 10, never admit more
// than 10, and the quota is not left idle either. Before the ledger each
// replica reserved in its own memory and both took the last units.
func TestTwoReplicasNeverOverAdmit(t *testing.T) {
	api := newFakeClient(t, append(world(t), ns("a", nil), teamQuota("team-a", "a", "10"))...)
	replicas := []*Accountant{
		NewAccountant(api, api, NewLedger(api, "gpuaas")),
		NewAccountant(api, api, NewLedger(api, "gpuaas")),
	}
	for round := range 3 {
		claims := make([]*resourceapi.ResourceClaim, 50)
		for i := range claims {
			claims[i] = claim("a", fmt.Sprintf("r%d-c%d", round, i), "h100", 1)
		}
		var admitted atomic.Int32
		var wg sync.WaitGroup
		for i, c := range claims {
			wg.Go(func() {
				adm, err := replicas[i%2].Admit(ctx(t), c, false)
				if err != nil {
					t.Errorf("claim %s: %v", c.Name, err)
				}
				if adm.Allowed {
					admitted.Add(1)
				}
			})
		}
		wg.Wait()
		if n := admitted.Load(); n != 10 {
			t.Fatalf("round %d: %d of 50 claims admitted against a limit of 10 GPU units", round, n)
		}
		// The claims' creates never persisted: once their reservations
		// lapse, the next round has the whole quota again.
		for _, r := range replicas {
			r.now = shiftedClock(reservationGrace * time.Duration(round+1))
		}
	}
}

// The book is an ordinary ConfigMap in the controller's namespace, named
// after the cohort (or the tenant) so that an operator can find it.
func TestLedgerBookPerCohort(t *testing.T) {
	q := teamQuota("team-a", "a", "1")
	q.Spec.Cohort = "research"
	acct, c := newAccountant(t, append(world(t), ns("a", nil), q)...)
	if adm, err := acct.Admit(ctx(t), claim("a", "x", "h100", 1), false); err != nil || !adm.Allowed {
		t.Fatalf("claim: %+v, %v", adm, err)
	}
	var cm corev1.ConfigMap
	if err := c.Get(ctx(t), client.ObjectKey{Namespace: "gpuaas", Name: "gpuaas-quota-cohort-research"}, &cm); err != nil {
		t.Fatalf("the cohort's book: %v", err)
	}
	entries, err := decodeBook(&cm)
	if err != nil || len(entries) != 1 || entries[0].Name != "x" || entries[0].Units != "1" {
		t.Fatalf("book holds %+v (%v); want the one reservation of claim x at 1 unit", entries, err)
	}
}

func TestBookNameFallsBackToAHash(t *testing.T) {
	long := "tenant/" + strings.Repeat("x", 300)
	if n := bookName(long); len(n) > 253 || !strings.HasPrefix(n, "gpuaas-quota-tenant-") {
		t.Fatalf("bookName of a long owner = %q", n)
	}
	if bookName("cohort/Research_Team") == bookName("cohort/research-team") {
		t.Fatal("two owners share a book")
	}
}

func shiftedClock(by time.Duration) func() time.Time {
	return func() time.Time { return time.Now().Add(by) }
}

// A book someone damaged (hand-edited, truncated) must not stop every
// admission of its tenant: the next admission starts it afresh.
func TestDamagedBookIsStartedAfresh(t *testing.T) {
	damaged := &corev1.ConfigMap{}
	damaged.Namespace, damaged.Name = "gpuaas", "gpuaas-quota-tenant-team-a"
	damaged.Data = map[string]string{ledgerDataKey: "{not json"}
	acct, c := newAccountant(t, append(world(t), ns("a", nil), teamQuota("team-a", "a", "1"), damaged)...)
	if adm, err := acct.Admit(ctx(t), claim("a", "x", "h100", 1), false); err != nil || !adm.Allowed {
		t.Fatalf("claim against a damaged book: %+v, %v", adm, err)
	}
	var cm corev1.ConfigMap
	if err := c.Get(ctx(t), client.ObjectKeyFromObject(damaged), &cm); err != nil {
		t.Fatal(err)
	}
	if entries, err := decodeBook(&cm); err != nil || len(entries) != 1 {
		t.Fatalf("book after the admission holds %+v (%v); want one reservation", entries, err)
	}
}

// Admissions that arrive while a book is being written wait for the next
// write and share it: 40 concurrent claims take far fewer than 40 writes,
// and the quota still holds exactly. One write per claim serialized them
// (28 claims/s with 8 creators on the real control plane).
func TestConcurrentAdmissionsShareBookWrites(t *testing.T) {
	api := newFakeClient(t, append(world(t), ns("a", nil), teamQuota("team-a", "a", "30"))...)
	var writes atomic.Int32
	slowWrites := interceptor.NewClient(api, interceptor.Funcs{
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			writes.Add(1)
			time.Sleep(5 * time.Millisecond) // an etcd write
			return c.Update(ctx, obj, opts...)
		},
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			writes.Add(1)
			time.Sleep(5 * time.Millisecond)
			return c.Create(ctx, obj, opts...)
		},
	})
	acct := NewAccountant(api, api, NewLedger(slowWrites, "gpuaas"))
	var admitted atomic.Int32
	var wg sync.WaitGroup
	claims := make([]*resourceapi.ResourceClaim, 40)
	for i := range claims {
		claims[i] = claim("a", fmt.Sprintf("c%d", i), "h100", 1)
	}
	for i, c := range claims {
		wg.Go(func() {
			adm, err := acct.Admit(ctx(t), c, false)
			if err != nil {
				t.Errorf("claim %d: %v", i, err)
			}
			if adm.Allowed {
				admitted.Add(1)
			}
		})
	}
	wg.Wait()
	if n := admitted.Load(); n != 30 {
		t.Errorf("%d of 40 claims admitted against a limit of 30", n)
	}
	if w := writes.Load(); w >= 20 {
		t.Errorf("%d book writes for 40 concurrent admissions; want them grouped", w)
	}
	t.Logf("40 concurrent admissions, %d book writes", writes.Load())
}
