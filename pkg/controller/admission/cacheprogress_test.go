package admission

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
)

// laggingCache is a replica's cache that has not yet shown some claims.
type laggingCache struct {
	mu     sync.Mutex
	hidden map[string]bool
}

func (l *laggingCache) reader(api client.WithWatch) client.Reader {
	return interceptor.NewClient(api, interceptor.Funcs{
		List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			if err := c.List(ctx, list, opts...); err != nil {
				return err
			}
			claims, ok := list.(*resourceapi.ResourceClaimList)
			if !ok {
				return nil
			}
			l.mu.Lock()
			defer l.mu.Unlock()
			kept := claims.Items[:0]
			for _, c := range claims.Items {
				if !l.hidden[c.Name] {
					kept = append(kept, c)
				}
			}
			claims.Items = kept
			return nil
		},
	})
}

func (l *laggingCache) catchUp() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.hidden = nil
}

// Issue 26 item 4. Replica A drops c1's reservation once its cache shows
// c1; replica B, whose cache has shown neither c1 nor c2, saw neither the
// reservation nor the claim and admitted a third claim against a limit of
// two. Now B waits until its cache reaches the claims the book stopped
// reserving, and then refuses; a cache that never gets there fails closed.
func TestLaggingReplicaWaitsForSettledClaims(t *testing.T) {
	for _, catchesUp := range []bool{true, false} {
		api := newFakeClient(t, append(world(t), ns("a", nil), teamQuota("team-a", "a", "2"))...)
		lag := &laggingCache{hidden: map[string]bool{"c1": true, "c2": true}}
		a := NewAccountant(api, api, NewLedger(api, "gpuaas"))
		b := NewAccountant(lag.reader(api), api, NewLedger(api, "gpuaas"))
		var tq = teamQuota("team-a", "a", "2")
		if err := api.Get(ctx(t), client.ObjectKeyFromObject(tq), tq); err != nil {
			t.Fatal(err)
		}
		b.observeClaimVersion(tq.ResourceVersion) // B's cache is as far as the quota

		create := func(acct *Accountant, name string) *resourceapi.ResourceClaim {
			c := claim("a", name, "h100", 1)
			if adm, err := acct.Admit(ctx(t), c, false); err != nil || !adm.Allowed {
				t.Fatalf("%s: %+v, %v", name, adm, err)
			}
			if err := api.Create(ctx(t), c); err != nil {
				t.Fatal(err)
			}
			a.observeClaimVersion(c.ResourceVersion)
			return c
		}
		create(a, "c1")
		a.now = shiftedClock(settleDelay + time.Second) // c1 is settled in A's cache
		c2 := create(a, "c2")

		if catchesUp {
			go func() {
				time.Sleep(100 * time.Millisecond)
				lag.catchUp()
				b.observeClaimVersion(c2.ResourceVersion)
			}()
		}
		adm, err := b.Admit(ctx(t), claim("a", "c3", "h100", 1), false)
		switch {
		case catchesUp && (err != nil || adm.Allowed):
			t.Errorf("after catching up: %+v, %v: want refused, team-a holds its 2 units", adm.Decision, err)
		case !catchesUp && (err == nil || !strings.Contains(err.Error(), "behind the quota ledger")):
			t.Errorf("with a cache that never catches up: %+v, %v: want it to fail closed", adm.Decision, err)
		}
	}
}

// resourceVersions compare as numbers ("10" is after "9"), and one that is
// not etcd's never makes an admission wait.
func TestNewerResourceVersion(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want bool
	}{
		{"10", "9", true}, {"9", "10", false}, {"7", "7", false},
		{"7", "", true}, {"", "7", false}, {"not-etcd", "7", false}, {"7", "not-etcd", false},
	} {
		if got := newer(tc.a, tc.b); got != tc.want {
			t.Errorf("newer(%q, %q) = %v, want %v", tc.a, tc.b, got, tc.want)
		}
	}
}
