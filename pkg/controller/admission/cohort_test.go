package admission

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller/internal/testworld"
	"github.com/gpuaas/gpu-dra-driver/pkg/quota"
)

// The cohort's running total must equal a sum from scratch after any
// sequence of claim events and reservations: claims created, allocated and
// deleted (each reported as the informer would), claims admitted and
// reserved before the cache shows them, reserved claims showing up, and
// reservations expiring. A path that forgets to update the total (a claim
// event not marking its namespace, a reservation not added or not taken
// out) leaves it off the sum from scratch.
func TestCohortRunningTotalMatchesASumFromScratch(t *testing.T) {
	objs := world(t)
	tenants := []struct {
		name   string
		cohort string
		limits gpuaas.QuotaLimits
	}{
		{"a", "c", gpuaas.QuotaLimits{GpuUnits: qty("4"), GpuMemory: qty("400Gi")}},
		{"b", "c", gpuaas.QuotaLimits{GpuUnits: qty("1.5")}},
		{"c", "c", gpuaas.QuotaLimits{Devices: map[string]int64{"h100": 3}}},
		{"d", "c", gpuaas.QuotaLimits{GpuUnits: qty("2"), GpuMemory: qty("-1")}}, // invalid: neither lends nor borrows
		{"e", "other", gpuaas.QuotaLimits{GpuUnits: qty("2")}},
		{"f", "", gpuaas.QuotaLimits{GpuUnits: qty("2")}},
	}
	for i, tn := range tenants {
		objs = append(objs, ns(tn.name, nil), tenantQuota(tn.name, i, gpuaas.TenantQuotaSpec{
			Namespaces: []string{tn.name}, Cohort: tn.cohort, Limits: tn.limits}))
	}
	mem := testworld.NewMemReader(objs...)
	acct := NewAccountant(mem, mem, NewLedger(newFakeClient(t), "gpuaas"))
	clock := time.Now()
	acct.now = func() time.Time { return clock }
	acct.ClaimChanged("") // an informer is feeding it
	w := &cohortWorld{t: t, acct: acct, mem: mem, deleted: map[types.UID]bool{}}
	rng := rand.New(rand.NewPCG(1, 2))
	for step := range 600 {
		tn := tenants[rng.IntN(len(tenants))].name
		switch op := rng.IntN(7); op {
		case 0:
			w.create(tn, fmt.Sprintf("c-%d", step), rng.IntN(2) == 0)
		case 1:
			w.allocate(rng, step)
		case 2:
			w.delete(rng)
		case 3:
			w.reserve(tn, fmt.Sprintf("r-%d", step), rng.IntN(2) == 0)
		case 4:
			w.arrive(rng)
		case 5:
			clock = clock.Add(time.Duration(rng.IntN(8)) * time.Second) // reservations expire
		case 6:
			w.changeCatalog(step)
		}
		for _, tn := range tenants {
			w.compare(step, tn.name)
		}
	}
}

// changeCatalog publishes another device on a node of its own (a price
// may move: the largest node, the memory) and tells the accountant, as the
// slice informer does; the running totals stay those of a sum from scratch.
func (w *cohortWorld) changeCatalog(step int) {
	var devs []resourceapi.Device
	for i := range 1 + step%5 {
		d := testworld.WholeGPU(i)
		if step%2 == 0 { // an H200's memory: the worst case of an h100 claim moves
			d.Capacity["memory"] = resourceapi.DeviceCapacity{Value: resource.MustParse("141Gi")}
		}
		devs = append(devs, d)
	}
	s := resourceSlice("node-grow", devs...)
	w.rv++
	s.ResourceVersion = fmt.Sprint(w.rv)
	w.mem.Put(s)
	w.acct.InvalidateCatalog()
}

type cohortWorld struct {
	t       *testing.T
	acct    *Accountant
	mem     *testworld.MemReader
	live    []*resourceapi.ResourceClaim // in the cache
	pending []*resourceapi.ResourceClaim // reserved, not in the cache yet
	deleted map[types.UID]bool
	rv      int
}

func (w *cohortWorld) put(c *resourceapi.ResourceClaim) {
	w.rv++
	c.ResourceVersion = fmt.Sprint(w.rv)
	w.mem.Put(c)
	w.acct.ClaimChanged(c.Namespace)
}

func (w *cohortWorld) create(namespace, name string, mig bool) {
	class := "h100"
	if mig {
		class = "mig-1g"
	}
	c := claim(namespace, name, class, 1)
	w.put(c)
	w.live = append(w.live, c)
}

func (w *cohortWorld) allocate(rng *rand.Rand, step int) {
	if len(w.live) == 0 {
		return
	}
	c := w.live[rng.IntN(len(w.live))].DeepCopy()
	if c.Spec.Devices.Requests[0].Exactly.DeviceClassName == "h100" {
		c = allocatedTo(c, "node-a", fmt.Sprintf("gpu-%d", step%4))
	} else {
		c = allocatedTo(c, "node-b", mig1g(step%7).Name)
	}
	w.put(c)
	for i := range w.live {
		if w.live[i].UID == c.UID {
			w.live[i] = c
		}
	}
}

func (w *cohortWorld) delete(rng *rand.Rand) {
	if len(w.live) == 0 {
		return
	}
	i := rng.IntN(len(w.live))
	c := w.live[i]
	w.live = append(w.live[:i], w.live[i+1:]...)
	w.mem.Remove(c)
	w.deleted[c.UID] = true
	w.acct.ClaimChanged(c.Namespace)
	w.acct.forgetClaim(c.UID)
}

func (w *cohortWorld) reserve(namespace, name string, mig bool) {
	class := "h100"
	if mig {
		class = "mig-1g"
	}
	c := claim(namespace, name, class, 1)
	if _, err := w.acct.admitOverruled(ctx(w.t), c, false, overruling{by: "test", classes: sets.New(class)}); err != nil {
		w.t.Fatal(err)
	}
	w.pending = append(w.pending, c)
}

// arrive shows a reserved claim in the cache.
func (w *cohortWorld) arrive(rng *rand.Rand) {
	if len(w.pending) == 0 {
		return
	}
	i := rng.IntN(len(w.pending))
	c := w.pending[i]
	w.pending = append(w.pending[:i], w.pending[i+1:]...)
	w.put(c)
	w.live = append(w.live, c)
}

// compare checks the running total's usage of a tenant and its peers' idle
// quota against a sum from scratch of the cache and the book.
func (w *cohortWorld) compare(step int, name string) {
	a := w.acct
	held := a.heldFor(ctx(w.t), name)
	cat, ten, err := a.snapshots(ctx(w.t))
	if err != nil {
		w.t.Fatal(err)
	}
	usage, idle, err := a.usageOf(ctx(w.t), cat, ten, name, held)
	if err != nil {
		w.t.Fatal(err)
	}
	t := ten.tenants[name]
	var peers []quota.Peer
	for _, q := range ten.quotas {
		if q.Name != name && q.Spec.Cohort == t.Cohort && t.Cohort != "" && ten.invalid[q.Name] == "" {
			peers = append(peers, quota.Peer{Tenant: ten.tenants[q.Name], Total: w.scratch(cat, ten, q.Name, held).Total()})
		}
	}
	want, wantIdle := w.scratch(cat, ten, name, held), quota.IdleOf(t, peers)
	if !sameUsage(usage, want) {
		w.t.Fatalf("step %d: usage of %s = used %s reserved %s claims %d; from scratch used %s reserved %s claims %d",
			step, name, usage.Used, usage.Reserved, usage.Claims, want.Used, want.Reserved, want.Claims)
	}
	if t.Cohort != "" && (idle.Units.Cmp(wantIdle.Units) != 0 || idle.Memory.Cmp(wantIdle.Memory) != 0) {
		w.t.Fatalf("step %d: idle of %s's peers = units %s memory %s; from scratch units %s memory %s",
			step, name, idle.Units, idle.Memory, wantIdle.Units, wantIdle.Memory)
	}
}

// scratch sums a tenant's claims as the cache shows them now and its
// reservations that still count, without any of the accountant's caches.
func (w *cohortWorld) scratch(cat *priceList, ten *tenancy, name string, held []reservation) quota.Usage {
	var tally quota.Tally
	now := w.acct.now()
	for _, namespace := range ten.assign.Namespaces[name] {
		var list resourceapi.ResourceClaimList
		if err := w.mem.List(ctx(w.t), &list, client.InNamespace(namespace)); err != nil {
			w.t.Fatal(err)
		}
		shown := map[types.NamespacedName]types.UID{}
		for i := range list.Items {
			c := &list.Items[i]
			shown[types.NamespacedName{Namespace: c.Namespace, Name: c.Name}] = c.UID
			if ch := cat.pricer.Cost(ctx(w.t), c); !ch.Charge.IsZero() {
				tally.Add(ch.Charge, ch.Allocated)
			}
		}
		for _, r := range held {
			if r.Namespace != namespace || now.Sub(r.At) >= reservationGrace || w.deleted[r.UID] || shown[r.key()] == r.UID {
				continue
			}
			c, err := r.charge()
			if err != nil {
				w.t.Fatal(err)
			}
			tally.Add(c, false)
		}
	}
	return tally.Usage()
}

func sameUsage(a, b quota.Usage) bool {
	same := func(x, y quota.Charge) bool {
		return x.Units.Cmp(y.Units) == 0 && x.Memory == y.Memory && maps.Equal(nonZero(x.Devices), nonZero(y.Devices))
	}
	return a.Claims == b.Claims && same(a.Used, b.Used) && same(a.Reserved, b.Reserved)
}

func nonZero(m map[string]int64) map[string]int64 {
	out := map[string]int64{}
	for k, v := range m {
		if v != 0 {
			out[k] = v
		}
	}
	return out
}

// blockingClaims stalls listing the claims of one namespace until released.
type blockingClaims struct {
	client.Reader
	namespace string
	once      sync.Once
	started   chan struct{}
	release   chan struct{}
}

func (r *blockingClaims) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	lo := &client.ListOptions{}
	lo.ApplyOptions(opts)
	if _, ok := list.(*resourceapi.ResourceClaimList); ok && lo.Namespace == r.namespace {
		r.once.Do(func() { close(r.started) })
		<-r.release
	}
	return r.Reader.List(ctx, list, opts...)
}

// Decisions lock their cohort, not the accountant: a decision stalled in
// one cohort (here, on a slow read of its claims) must not hold up a
// tenant of another.
func TestCohortsDecideIndependently(t *testing.T) {
	objs := append(world(t), ns("slow", nil), ns("a", nil),
		tenantQuota("team-slow", 0, gpuaas.TenantQuotaSpec{Namespaces: []string{"slow"}, Cohort: "x", Limits: gpuaas.QuotaLimits{GpuUnits: qty("2")}}),
		tenantQuota("team-a", 1, gpuaas.TenantQuotaSpec{Namespaces: []string{"a"}, Cohort: "y", Limits: gpuaas.QuotaLimits{GpuUnits: qty("2")}}))
	c := newFakeClient(t, objs...)
	slow := &blockingClaims{Reader: c, namespace: "slow", started: make(chan struct{}), release: make(chan struct{})}
	acct := NewAccountant(slow, c, NewLedger(c, "gpuaas"))
	stalled := make(chan error, 1)
	go func() {
		_, err := acct.Admit(ctx(t), claim("slow", "c", "h100", 1), false)
		stalled <- err
	}()
	<-slow.started
	admitsWhileStalled(t, acct, slow.release, "an admission in cohort y waited for a decision in cohort x")
	if err := <-stalled; err != nil {
		t.Fatal(err)
	}
}

// A quota's status write (after nearly every admission) must not
// invalidate the tenancy: that rebuilds every cohort's running total. A
// spec change must.
func TestQuotaStatusWriteKeepsTheTenancy(t *testing.T) {
	acct, _ := newAccountant(t)
	h := quotaHandler(acct, NewNudger(nil, false))
	old := teamQuota("team-a", "a", "1")
	statusOnly := old.DeepCopy()
	statusOnly.Status.ClaimsCounted = 3
	gen := acct.tenancyGen.Load()
	h.OnUpdate(old, statusOnly)
	if acct.tenancyGen.Load() != gen {
		t.Error("a status write of a quota invalidated the tenancy")
	}
	specChanged := old.DeepCopy()
	specChanged.Generation++
	h.OnUpdate(old, specChanged)
	if acct.tenancyGen.Load() == gen {
		t.Error("a spec change of a quota left the tenancy as it was")
	}
}
