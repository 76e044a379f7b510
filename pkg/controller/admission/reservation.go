package admission

import (
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/gpuaas/gpu-dra-driver/pkg/quota"
)

// A reservation is the webhook's hold on quota between admitting a claim
// and the claim showing up in the informer cache. Its whole life is decided
// here, by one rule (phase), which every caller asks instead of deciding
// again: the running totals (cohort.go), the book a new admission writes
// (Accountant.reserve), the reclaim planner (reclaim.go) and the book
// sweeper (booksweep.go).
//
// As one replica sees it, a reservation is in exactly one phase:
//
//	pending  it counts against its tenant and its cohort.
//	shown    the cache shows its claim (same UID): the claim counts itself.
//	gone     the cache saw its claim deleted: it holds nothing.
//	covered  the cache shows another claim under its name that costs at
//	         least as much in every resource: of the two at most one exists
//	         (a re-run create that fails with AlreadyExists, or a claim
//	         re-created a moment after its predecessor was deleted), so it
//	         adds nothing.
//	contested the cache shows another claim under its name that costs
//	         less: the create fails with AlreadyExists unless that claim is
//	         deleted first. It counts for its own tenant, which cannot
//	         admit more on top of it, and not for the other tenants of its
//	         cohort: a re-run create of a dearer spec held a lender's quota
//	         for reservationGrace with nothing in the API (issue 36 route
//	         3). Should the other claim be deleted first and the create
//	         succeed, the peers miss the claim only until their cache shows
//	         the deletion (then it is pending) or the claim (shown).
//	lapsed   reservationGrace has passed since admission: the create was
//	         either persisted (every cache shows it) or failed (a later
//	         admission plugin refused it, or the name was taken).
//
// Only pending counts (and contested, for its own tenant); a reclaim entry (reclaim.go) has no claim, so it is
// pending until it lapses, and it counts for every tenant's decision except
// its own tenant's. A book drops a lapsed reservation, and a shown or gone
// one once settleDelay has passed (every other replica's cache has seen the
// claim by then; the book records the claim's resourceVersion as settled so
// that one lagging further waits for it, cacheprogress.go). A new
// reservation of a claim name replaces the name's other reservations, and
// holds the dearer of each resource of those pending or covered (reserve).
type reservation struct {
	UID       types.UID        `json:"uid"`
	Namespace string           `json:"namespace"`
	Name      string           `json:"name"`
	Units     string           `json:"units"` // exact: "3/7"
	Memory    int64            `json:"memory,omitempty"`
	Devices   map[string]int64 `json:"devices,omitempty"`
	Shapes    map[string]int64 `json:"shapes,omitempty"`
	At        time.Time        `json:"at"`
	// Reclaim marks quota reclaimed from borrowers for the tenant of
	// Namespace (reclaim.go): no claim of that name; it counts for every
	// other tenant's decisions, not for that tenant's own.
	Reclaim bool `json:"reclaim,omitempty"`
}

// phase is where a reservation is in its life, as one replica sees it.
type phase int

const (
	pending phase = iota
	shown
	gone
	covered
	lapsed
	contested
)

func (p phase) String() string {
	return [...]string{"pending", "shown", "gone", "covered", "lapsed", "contested"}[p]
}

// Lifetimes of a reservation.
const (
	// reservationGrace bounds a reservation's life: longer than the
	// longest webhook timeout (30 s), so by then its create has either
	// been persisted or failed.
	reservationGrace = 35 * time.Second
	// settleDelay: a reservation whose claim this replica's cache already
	// shows is dropped from the book after this long, when every other
	// replica's cache has most likely seen the claim too (watch latency is
	// milliseconds in a healthy cluster); one that has not waits for the
	// book's settled resourceVersion (cacheprogress.go) before it decides,
	// so the delay only spares a lagging replica that wait. A book's size
	// is what each admission writes: with 10 s, 200 claims in a burst made
	// every write carry them all and doubled the admission latency; with
	// 3 s, one creator's claims in a tenant's namespace took 17 ms each
	// through the real control plane against 3.8 ms where nothing is
	// reserved, 8 of them in writing a book of about 100 entries (issue 36).
	settleDelay = 250 * time.Millisecond
)

// claimView is what one replica's cache shows of claims, as the rule reads
// it.
type claimView interface {
	// named is the UID and resourceVersion of the claim the cache shows
	// under key; ok is false when it shows none.
	named(key types.NamespacedName) (uid types.UID, resourceVersion string, ok bool)
	// sawDeleted: the cache saw the claim with uid deleted.
	sawDeleted(uid types.UID) bool
	// costOf is what the shown claim with uid costs.
	costOf(uid types.UID) quota.Charge
}

// phase is the one rule: where r is, given what the cache shows and the
// clock.
func (r reservation) phase(v claimView, now time.Time) phase {
	if r.lapsed(now) {
		return lapsed
	}
	if v.sawDeleted(r.UID) {
		return gone
	}
	uid, _, ok := v.named(r.key())
	switch {
	case !ok:
		return pending
	case uid == r.UID:
		return shown
	}
	c, err := r.charge()
	switch {
	case err != nil: // damaged: held until it lapses
		return pending
	case covers(v.costOf(uid), c):
		return covered
	}
	return contested
}

// lapsed: the clock alone has ended r, whatever any cache shows. The
// callers that have no cache to ask (the book sweeper, the reclaim planner
// for its own entries, which no cache ever shows) use this part of phase.
func (r reservation) lapsed(now time.Time) bool { return now.Sub(r.At) >= reservationGrace }

// countsFor: r, in phase p and charged to tenant owner, counts in a
// decision for tenant.
func (r reservation) countsFor(p phase, owner, tenant string) bool {
	return (p == pending && (!r.Reclaim || owner != tenant)) || (p == contested && owner == tenant)
}

// settled: a book may drop r, in phase p, its claim resolved in this
// replica's cache for settleDelay; the book then records the claim's
// resourceVersion, from v ("" for a deletion: a lagging replica that has
// not seen the claim does not count it either way).
func (r reservation) settled(p phase, v claimView, now time.Time) (string, bool) {
	if (p != shown && p != gone) || now.Sub(r.At) < settleDelay {
		return "", false
	}
	if p == gone {
		return "", true
	}
	_, rv, _ := v.named(r.key())
	return rv, true
}

// carriesOver: a new reservation of r's claim name, which replaces r in
// the book, takes on r's cost (the dearer of the two in each resource)
// while r, in phase p, still holds or may hold quota: pending, covered or
// contested.
func (p phase) carriesOver() bool { return p == pending || p == covered || p == contested }

// covers: c costs at least d in every resource.
func covers(c, d quota.Charge) bool {
	if c.Units.Cmp(d.Units) < 0 || c.Memory < d.Memory {
		return false
	}
	for class, n := range d.Devices {
		if c.Devices[class] < n {
			return false
		}
	}
	for name, n := range d.Shapes {
		if c.Shapes[name] < n {
			return false
		}
	}
	return true
}

func newReservation(claim types.NamespacedName, uid types.UID, c quota.Charge, at time.Time) reservation {
	return reservation{UID: uid, Namespace: claim.Namespace, Name: claim.Name,
		Units: c.Units.Exact(), Memory: c.Memory, Devices: c.Devices, Shapes: c.Shapes, At: at}
}

// sizeBound is at least the length of r in a book's JSON (with its
// separating comma), worked out without encoding it: names, UIDs, class
// names and units need no escaping (the API server validated them), an
// int64 has at most 20 characters and a time in RFC 3339 at most 35.
func (r reservation) sizeBound() int {
	const fixed = len(`{"uid":"","namespace":"","name":"","units":"","memory":,"devices":{},"shapes":{},"at":"","reclaim":true},`) + 20 + 35
	n := fixed + len(r.UID) + len(r.Namespace) + len(r.Name) + len(r.Units)
	for _, m := range []map[string]int64{r.Devices, r.Shapes} {
		for name := range m {
			n += len(`"":,`) + len(name) + 20
		}
	}
	return n
}

func (r reservation) key() types.NamespacedName {
	return types.NamespacedName{Namespace: r.Namespace, Name: r.Name}
}

func (r reservation) charge() (quota.Charge, error) {
	u, err := quota.ParseUnits(r.Units)
	if err != nil {
		return quota.Charge{}, fmt.Errorf("reservation of claim %s: %w", r.key(), err)
	}
	return quota.Charge{Units: u, Memory: r.Memory, Devices: r.Devices, Shapes: r.Shapes}, nil
}
