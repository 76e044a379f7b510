package admission

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/quota"
)

// fakeView is a cache that shows the claims in shows (by name: UID,
// resourceVersion, cost) and saw those in deleted go.
type fakeView struct {
	shows   map[types.NamespacedName]fakeClaim
	deleted map[types.UID]bool
}

type fakeClaim struct {
	uid  types.UID
	rv   string
	cost quota.Charge
}

func (v fakeView) named(key types.NamespacedName) (types.UID, string, bool) {
	c, ok := v.shows[key]
	return c.uid, c.rv, ok
}

func (v fakeView) sawDeleted(uid types.UID) bool { return v.deleted[uid] }

func (v fakeView) costOf(uid types.UID) quota.Charge {
	for _, c := range v.shows {
		if c.uid == uid {
			return c.cost
		}
	}
	return quota.Charge{}
}

// The reservation's one rule, case by case: what the cache shows of its
// claim (nothing, the claim, its deletion, another claim of the name that
// costs as much or less) by the clock (fresh, past settleDelay, past
// reservationGrace), and what follows from the phase: whether it counts,
// whether a book drops it as settled (with which resourceVersion), and
// whether a new reservation of its name takes on its cost.
func TestReservationPhase(t *testing.T) {
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	key := types.NamespacedName{Namespace: "a", Name: "c"}
	r := newReservation(key, "uid-1", quota.Charge{Units: quota.WholeUnits(2), Memory: 10}, at)
	cheap := quota.Charge{Units: quota.WholeUnits(1), Memory: 10}
	dear := quota.Charge{Units: quota.WholeUnits(2), Memory: 20}
	caches := map[string]fakeView{
		"shows nothing":             {},
		"shows the claim":           {shows: map[types.NamespacedName]fakeClaim{key: {uid: "uid-1", rv: "17"}}},
		"saw the claim deleted":     {deleted: map[types.UID]bool{"uid-1": true}},
		"shows a dearer same-name":  {shows: map[types.NamespacedName]fakeClaim{key: {uid: "uid-2", rv: "18", cost: dear}}},
		"shows a cheaper same-name": {shows: map[types.NamespacedName]fakeClaim{key: {uid: "uid-2", rv: "18", cost: cheap}}},
		"shows another name":        {shows: map[types.NamespacedName]fakeClaim{{Namespace: "a", Name: "d"}: {uid: "uid-3", rv: "19", cost: dear}}},
	}
	clocks := map[string]time.Duration{
		"fresh":            settleDelay / 2,
		"past settleDelay": settleDelay,
		"past the grace":   reservationGrace,
	}
	type want struct {
		phase   phase
		settled bool   // a book drops it as settled
		rv      string // the settled resourceVersion recorded
	}
	cases := []struct {
		cache, clock string
		want         want
	}{
		{"shows nothing", "fresh", want{phase: pending}},
		{"shows nothing", "past settleDelay", want{phase: pending}},
		{"shows nothing", "past the grace", want{phase: lapsed}},
		{"shows the claim", "fresh", want{phase: shown}},
		{"shows the claim", "past settleDelay", want{phase: shown, settled: true, rv: "17"}},
		{"shows the claim", "past the grace", want{phase: lapsed}},
		{"saw the claim deleted", "fresh", want{phase: gone}},
		{"saw the claim deleted", "past settleDelay", want{phase: gone, settled: true}},
		{"saw the claim deleted", "past the grace", want{phase: lapsed}},
		{"shows a dearer same-name", "fresh", want{phase: covered}},
		{"shows a dearer same-name", "past settleDelay", want{phase: covered}},
		{"shows a dearer same-name", "past the grace", want{phase: lapsed}},
		// Issue 36 route 3: a re-run create of a dearer spec.
		{"shows a cheaper same-name", "fresh", want{phase: contested}},
		{"shows a cheaper same-name", "past settleDelay", want{phase: contested}},
		{"shows a cheaper same-name", "past the grace", want{phase: lapsed}},
		{"shows another name", "fresh", want{phase: pending}},
		{"shows another name", "past the grace", want{phase: lapsed}},
	}
	for _, tc := range cases {
		t.Run(tc.cache+"/"+tc.clock, func(t *testing.T) {
			v := caches[tc.cache]
			now := at.Add(clocks[tc.clock])
			p := r.phase(v, now)
			if p != tc.want.phase {
				t.Fatalf("phase %s, want %s", p, tc.want.phase)
			}
			if got, want := r.countsFor(p, "team-a", "team-b"), p == pending; got != want {
				t.Errorf("counts for another tenant %v, want %v", got, want)
			}
			if got, want := r.countsFor(p, "team-a", "team-a"), p == pending || p == contested; got != want {
				t.Errorf("counts for its own tenant %v, want %v", got, want)
			}
			rv, settled := r.settled(p, v, now)
			if settled != tc.want.settled || rv != tc.want.rv {
				t.Errorf("settled %v at %q, want %v at %q", settled, rv, tc.want.settled, tc.want.rv)
			}
			if got, want := p.carriesOver(), p == pending || p == covered || p == contested; got != want {
				t.Errorf("carries over %v, want %v", got, want)
			}
		})
	}
}

// A reclaim entry holds quota for its tenant against the others, not
// against the tenant itself; and like any reservation only while pending.
func TestReclaimEntryCountsForOthersOnly(t *testing.T) {
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	r := newReservation(types.NamespacedName{Namespace: "a"}, "reclaim-uid-1", quota.Charge{Units: quota.WholeUnits(1)}, at)
	r.Reclaim = true
	if p := r.phase(fakeView{}, at.Add(time.Second)); p != pending {
		t.Fatalf("a fresh reclaim entry is %s, want pending", p)
	}
	if !r.countsFor(pending, "team-a", "team-b") {
		t.Error("a reclaim entry of team-a does not count in team-b's decision")
	}
	if r.countsFor(pending, "team-a", "team-a") {
		t.Error("a reclaim entry of team-a counts in team-a's own decision")
	}
	if p := r.phase(fakeView{}, at.Add(reservationGrace)); p != lapsed || r.countsFor(p, "team-a", "team-b") {
		t.Errorf("a reclaim entry past the grace is %s and counts %v, want lapsed and not", p, r.countsFor(p, "team-a", "team-b"))
	}
}

// A reservation whose cost cannot be read (a damaged book) is never taken
// for covered by a claim of its name: it stays pending until it lapses.
func TestDamagedReservationIsNeverCovered(t *testing.T) {
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	key := types.NamespacedName{Namespace: "a", Name: "c"}
	r := reservation{UID: "uid-1", Namespace: "a", Name: "c", Units: "not a number", At: at}
	v := fakeView{shows: map[types.NamespacedName]fakeClaim{key: {uid: "uid-2", cost: quota.Charge{Units: quota.WholeUnits(8)}}}}
	if p := r.phase(v, at.Add(time.Second)); p != pending {
		t.Errorf("phase %s, want pending", p)
	}
}

// Issue 36 route 3, through admission: the tenant holds claim "own" (one
// GPU) and re-runs its create with two, which is admitted by borrowing the
// peer's idle unit and then fails AlreadyExists. Its reservation held that
// unit for reservationGrace, refusing the peer its own quota; now it
// counts for the tenant only.
func TestDearerRerunDoesNotLockTheLenderOut(t *testing.T) {
	objs := append(world(t), ns("a", nil), ns("b", nil),
		tenantQuota("team-a", 0, gpuaas.TenantQuotaSpec{Namespaces: []string{"a"}, Cohort: "research", Limits: gpuaas.QuotaLimits{GpuUnits: qty("2")}}),
		tenantQuota("team-b", 1, gpuaas.TenantQuotaSpec{Namespaces: []string{"b"}, Cohort: "research", Limits: gpuaas.QuotaLimits{GpuUnits: qty("1")}}),
		claim("a", "own", "h100", 1))
	acct, _ := newAccountant(t, objs...)
	adm, err := acct.Admit(ctx(t), claim("a", "own", "h100", 2), false)
	if err != nil || !adm.Allowed || !adm.Borrows {
		t.Fatalf("the re-run create of a dearer spec: %+v, %v; want admitted, borrowing", adm.Decision, err)
	}
	// The API server answers AlreadyExists: nothing of the re-run exists.
	adm, err = acct.Admit(ctx(t), claim("b", "peer", "h100", 1), false)
	if err != nil || !adm.Allowed {
		t.Fatalf("the peer asking for its own unit: %+v, %v; want admitted", adm.Decision, err)
	}
	adm, err = acct.Admit(ctx(t), claim("a", "more", "h100", 1), false)
	if err != nil || adm.Allowed {
		t.Fatalf("the tenant adding a claim on top of its re-run: %+v, %v; want refused", adm.Decision, err)
	}
}
