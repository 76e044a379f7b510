package admission

import (
	"context"
	"fmt"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/resourceversion"
)

// A replica drops a reservation from its book once its own cache shows the
// claim: the claim then counts itself. Another replica whose cache lags
// would see neither the reservation nor the claim and admit past the limit
// (issue 26 item 4). So the dropping replica records in the book the
// highest resourceVersion of the claims it settled that way, and a replica
// decides on a book only when its cache has got at least that far; a watch
// delivers a resource's events in resourceVersion order, so by then it
// shows every claim the book stopped reserving. (ResourceClaims are served
// from etcd, whose resourceVersions Kubernetes defines as comparable.)

// catchUpWait bounds how long an admission waits for this replica's cache
// to reach a book's settled resourceVersion before it fails closed: watch
// latency is milliseconds in a healthy cluster, and the webhook's own
// timeout must leave room for the write after it.
const catchUpWait = 2 * time.Second

// claimProgress is how far this replica's ResourceClaim cache has got: the
// highest resourceVersion its handler was given. The handler runs after
// the cache stored the event, so the cache is at least this far.
type claimProgress struct {
	mu       sync.Mutex
	rv       string
	advanced chan struct{} // closed and replaced when rv grows
}

func newClaimProgress() *claimProgress {
	return &claimProgress{advanced: make(chan struct{})}
}

// observe records that the cache holds everything up to rv.
func (p *claimProgress) observe(rv string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if rv == "" || !newer(rv, p.rv) {
		return
	}
	p.rv = rv
	close(p.advanced)
	p.advanced = make(chan struct{})
}

func (p *claimProgress) state() (string, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.rv, p.advanced
}

// await returns once the cache is at least at target, or an error after
// bound. A replica that has never observed a claim event (a unit test with
// no informer) has no position and does not wait.
func (p *claimProgress) await(ctx context.Context, target string, bound time.Duration) error {
	if target == "" {
		return nil
	}
	timer := time.NewTimer(bound)
	defer timer.Stop()
	for {
		rv, advanced := p.state()
		if rv == "" || !newer(target, rv) {
			return nil
		}
		select {
		case <-advanced:
		case <-timer.C:
			return fmt.Errorf("this replica's cache of ResourceClaims is at resourceVersion %s, behind the quota ledger's %s (claims another replica counted): retry in a moment", rv, target)
		case <-ctx.Done():
			return fmt.Errorf("waiting for the ResourceClaim cache to reach resourceVersion %s: %w", target, ctx.Err())
		}
	}
}

// newer: a is a later resourceVersion than b. One that cannot be compared
// (not etcd's) is never newer, so nothing waits on it.
func newer(a, b string) bool {
	if b == "" {
		return a != ""
	}
	c, err := resourceversion.CompareResourceVersion(a, b)
	return err == nil && c > 0
}

// laterVersion is the later of two resourceVersions.
func laterVersion(a, b string) string {
	if newer(a, b) {
		return a
	}
	return b
}
