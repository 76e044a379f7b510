package admission

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/quota"
)

func TestAdmit(t *testing.T) {
	tests := []struct {
		name    string
		objs    []client.Object
		claim   *resourceapi.ResourceClaim
		deny    bool
		allowed bool
		reason  []string
		opts    func(*Accountant)
	}{
		{
			name:  "under the limit",
			objs:  []client.Object{ns("a", nil), teamQuota("team-a", "a", "2")},
			claim: claim("a", "new", "h100", 2), allowed: true,
		},
		{
			name: "at the limit: allocated claims count at their devices",
			objs: []client.Object{ns("a", nil), teamQuota("team-a", "a", "2"),
				allocatedTo(claim("a", "old", "h100", 2), "node-a", "gpu-0", "gpu-1")},
			claim:  claim("a", "new", "h100", 1),
			reason: []string{`TenantQuota "team-a" exceeded`, "gpuUnits: used 2, reserved 0, requested 1, limit 2"},
		},
		{
			name:   "unallocated claims count at their worst case",
			objs:   []client.Object{ns("a", nil), teamQuota("team-a", "a", "1"), claim("a", "old", "h100", 1)},
			claim:  claim("a", "new", "mig-1g", 1),
			reason: []string{"used 0, reserved 1, requested 1/7 (~0.143), limit 1"},
		},
		{
			name: "MIG slices are charged by their share of the GPU",
			objs: []client.Object{ns("a", nil), teamQuota("team-a", "a", "1"),
				allocatedTo(claim("a", "old", "mig-1g", 6), "node-b",
					"gpu-0-mig-1g-0", "gpu-0-mig-1g-1", "gpu-0-mig-1g-2", "gpu-0-mig-1g-3", "gpu-0-mig-1g-4", "gpu-0-mig-1g-5")},
			claim: claim("a", "new", "mig-1g", 1), allowed: true,
		},
		{
			name: "claims of other namespaces do not count",
			objs: []client.Object{ns("a", nil), ns("b", nil), teamQuota("team-a", "a", "1"),
				allocatedTo(claim("b", "old", "h100", 2), "node-a", "gpu-0", "gpu-1")},
			claim: claim("a", "new", "h100", 1), allowed: true,
		},
		{
			name:  "namespace without a quota",
			objs:  []client.Object{ns("free", nil)},
			claim: claim("free", "new", "h100", 4), allowed: true,
		},
		{
			name:   "namespace without a quota, deny-unassigned",
			objs:   []client.Object{ns("free", nil)},
			claim:  claim("free", "new", "h100", 1),
			opts:   func(a *Accountant) { a.DenyUnassigned = true },
			reason: []string{"namespace free belongs to no TenantQuota"},
		},
		{
			name:  "another driver's class is free",
			objs:  []client.Object{ns("a", nil), teamQuota("team-a", "a", "0"), nicClass()},
			claim: claim("a", "nic", "nic.example.com", 1), allowed: true,
		},
		{
			// Issue 12 item 5: it was free, then allocated past quota
			// once someone created the class.
			name:   "a class that does not exist yet is priced as a GPU",
			objs:   []client.Object{ns("a", nil), teamQuota("team-a", "a", "0")},
			claim:  claim("a", "later", "not-yet", 1),
			reason: []string{"requested 1, limit 0"},
		},
		{
			name: "namespace found by label selector",
			objs: []client.Object{ns("ml-1", map[string]string{"team": "ml"}),
				tenantQuota("ml", 0, gpuaas.TenantQuotaSpec{
					NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "ml"}},
					Limits:            gpuaas.QuotaLimits{GpuUnits: qty("0")},
				})},
			claim:  claim("ml-1", "new", "h100", 1),
			reason: []string{`TenantQuota "ml" exceeded`},
		},
		{
			name: "two quotas claim the namespace: the older one charges",
			objs: []client.Object{ns("a", nil),
				tenantQuota("newer", 5, gpuaas.TenantQuotaSpec{Namespaces: []string{"a"}, Limits: gpuaas.QuotaLimits{GpuUnits: qty("10")}}),
				tenantQuota("older", 1, gpuaas.TenantQuotaSpec{Namespaces: []string{"a"}, Limits: gpuaas.QuotaLimits{GpuUnits: qty("0")}})},
			claim:  claim("a", "new", "h100", 1),
			reason: []string{`TenantQuota "older" exceeded`},
		},
		{
			name: "an invalid quota refuses claims",
			objs: []client.Object{ns("a", nil),
				tenantQuota("broken", 0, gpuaas.TenantQuotaSpec{Namespaces: []string{"a"}, Limits: gpuaas.QuotaLimits{GpuUnits: qty("-1")}})},
			claim:  claim("a", "new", "h100", 1),
			reason: []string{`TenantQuota "broken" is invalid`, "spec.limits.gpuUnits", "must not be negative"},
		},
		{
			// Issue 12 item 9: device limits applied to the class
			// requested, so a generic class handed out an H100 anyway.
			name: "a device limit holds whatever class the device comes through",
			objs: []client.Object{ns("a", nil), genericClass(),
				tenantQuota("no-h100", 0, gpuaas.TenantQuotaSpec{Namespaces: []string{"a"},
					Limits: gpuaas.QuotaLimits{GpuUnits: qty("8"), Devices: map[string]int64{"h100": 0}}})},
			claim:  claim("a", "sneaky", "any-gpu", 1),
			reason: []string{`devices of profile "h100"`, "limit 0"},
		},
		{
			name: "borrowing from an idle cohort peer",
			objs: []client.Object{ns("a", nil), ns("b", nil),
				tenantQuota("team-a", 0, gpuaas.TenantQuotaSpec{Namespaces: []string{"a"}, Cohort: "research",
					Limits: gpuaas.QuotaLimits{GpuUnits: qty("1")}, BorrowingLimit: &gpuaas.BorrowingLimit{GpuUnits: qty("1")}}),
				tenantQuota("team-b", 1, gpuaas.TenantQuotaSpec{Namespaces: []string{"b"}, Cohort: "research",
					Limits: gpuaas.QuotaLimits{GpuUnits: qty("2")}})},
			claim: claim("a", "new", "h100", 2), allowed: true,
		},
		{
			name: "borrowing stops when the peer uses its quota",
			objs: []client.Object{ns("a", nil), ns("b", nil),
				tenantQuota("team-a", 0, gpuaas.TenantQuotaSpec{Namespaces: []string{"a"}, Cohort: "research",
					Limits: gpuaas.QuotaLimits{GpuUnits: qty("1")}}),
				tenantQuota("team-b", 1, gpuaas.TenantQuotaSpec{Namespaces: []string{"b"}, Cohort: "research",
					Limits: gpuaas.QuotaLimits{GpuUnits: qty("2")}}),
				allocatedTo(claim("b", "busy", "h100", 2), "node-a", "gpu-0", "gpu-1")},
			claim:  claim("a", "new", "h100", 2),
			reason: []string{`cohort "research" has 0 idle to lend, 1 needed`},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			acct, _ := newAccountant(t, append(world(t), tt.objs...)...)
			if tt.opts != nil {
				tt.opts(acct)
			}
			adm, err := acct.Admit(ctx(t), tt.claim, false)
			if err != nil {
				t.Fatal(err)
			}
			if adm.Allowed != tt.allowed {
				t.Fatalf("allowed = %v (%s), want %v", adm.Allowed, adm.Reason, tt.allowed)
			}
			for _, part := range tt.reason {
				if !strings.Contains(adm.Reason, part) {
					t.Errorf("reason %q lacks %q", adm.Reason, part)
				}
			}
		})
	}
}

// Two claims admitted back to back, before the informer shows the first:
// the second sees the first's reservation. A dry run reserves nothing, a
// claim the cache shows is counted once, a deleted one not at all, and a
// reservation whose create never persisted expires.
func TestAdmitReservesUntilTheCacheCatchesUp(t *testing.T) {
	acct, c := newAccountant(t, append(world(t), ns("a", nil), teamQuota("team-a", "a", "1"))...)
	if adm, _ := acct.Admit(ctx(t), claim("a", "dry", "h100", 1), true); !adm.Allowed {
		t.Fatalf("dry run denied: %s", adm.Reason)
	}
	first := claim("a", "first", "h100", 1)
	if adm, _ := acct.Admit(ctx(t), first, false); !adm.Allowed {
		t.Fatalf("first claim denied: %s", adm.Reason)
	}
	adm, _ := acct.Admit(ctx(t), claim("a", "second", "h100", 1), false)
	if adm.Allowed || !strings.Contains(adm.Reason, "reserved 1") {
		t.Fatalf("second claim: allowed %v, %q; want a denial counting the first as reserved", adm.Allowed, adm.Reason)
	}
	// The first shows up in the cache: counted once, not twice.
	if err := c.Create(ctx(t), first); err != nil {
		t.Fatal(err)
	}
	rep, err := acct.Report(ctx(t), "team-a")
	if err != nil {
		t.Fatal(err)
	}
	if rep.Usage.Claims != 1 {
		t.Fatalf("claims counted %d; want 1 (the claim, not also its reservation)", rep.Usage.Claims)
	}
	// Deleted (the informer tells the accountant): its reservation holds
	// nothing either.
	if err := c.Delete(ctx(t), first); err != nil {
		t.Fatal(err)
	}
	acct.forgetClaim(first.UID)
	if adm, _ := acct.Admit(ctx(t), claim("a", "third", "h100", 1), false); !adm.Allowed {
		t.Fatalf("third claim denied: %s", adm.Reason)
	}
	// The third's create never persisted: its reservation lapses.
	acct.now = func() time.Time { return time.Now().Add(reservationGrace + time.Second) }
	if adm, _ := acct.Admit(ctx(t), claim("a", "fourth", "h100", 1), false); !adm.Allowed {
		t.Fatalf("fourth claim denied after the third's reservation expired: %s", adm.Reason)
	}
}

// A claim deleted and created again under the same name is a new claim:
// the old one in the cache does not hide the new one's reservation where
// the new one costs more (of the two at most one exists, so where it costs
// no more the old one counted is enough, see countsIn).
func TestAdmitCountsARecreatedClaim(t *testing.T) {
	old := claim("a", "train", "h100", 1)
	acct, _ := newAccountant(t, append(world(t), ns("a", nil), teamQuota("team-a", "a", "3"), old)...)
	again := claim("a", "train", "h100", 2) // same name, new UID; the cache still shows the old
	if adm, _ := acct.Admit(ctx(t), again, false); !adm.Allowed {
		t.Fatalf("recreated claim denied: %s", adm.Reason)
	}
	adm, _ := acct.Admit(ctx(t), claim("a", "other", "h100", 2), false)
	if adm.Allowed {
		t.Fatal("4 devices admitted under a limit of 3: the recreated claim's reservation was hidden by the old claim of the same name")
	}
}

// Issue 26 item 5: re-running a create of an existing claim reserved it
// under a fresh UID each time, and the API server then failed the create
// with AlreadyExists: the reservations held the tenant's quota for
// reservationGrace with nothing in the API, and filled the book. A name
// holds one reservation, and one no dearer than the claim the cache shows
// holds nothing more.
func TestRecreatingAClaimNameLeavesOneReservation(t *testing.T) {
	existing := claim("a", "train", "h100", 1)
	acct, _ := newAccountant(t, append(world(t), ns("a", nil), teamQuota("team-a", "a", "2"), existing)...)
	for i := range 20 {
		if adm, err := acct.Admit(ctx(t), claim("a", "train", "h100", 1), false); err != nil || !adm.Allowed {
			t.Fatalf("create %d of the existing name: %+v, %v", i, adm.Decision, err)
		}
	}
	n := 0
	for _, r := range acct.heldFor(ctx(t), "team-a") {
		if r.Name == "train" {
			n++
		}
	}
	if n != 1 {
		t.Errorf("%d reservations for claim a/train after 20 creates of the name, want 1", n)
	}
	if adm, _ := acct.Admit(ctx(t), claim("a", "other", "h100", 1), false); !adm.Allowed {
		t.Errorf("the tenant's second GPU refused after failed creates of a name it holds: %s", adm.Reason)
	}
}

// The reservations of one tenant cannot grow its book past a cap: a
// tenant with no units limit (creates that then fail for another reason
// hold nothing it would be refused for) is refused with a message saying
// why, before the ConfigMap could outgrow the API's 1 MiB and fail every
// admission of its cohort.
func TestBookSizeIsCapped(t *testing.T) {
	q := tenantQuota("team-a", 0, gpuaas.TenantQuotaSpec{Namespaces: []string{"a"}, Limits: gpuaas.QuotaLimits{Devices: map[string]int64{"mig-1g": 1}}})
	acct, api := newAccountant(t, append(world(t), ns("a", nil), q)...)
	// The clock stands still: on a slow machine the first reservations
	// lapsed (reservationGrace) before the book filled, and it never did.
	frozen := time.Now()
	acct.now = func() time.Time { return frozen }
	var adm Admission
	i := 0
	for ; i < 5000; i++ {
		var err error
		if adm, err = acct.Admit(ctx(t), claim("a", fmt.Sprintf("c%d", i), "h100", 1), false); err != nil {
			t.Fatal(err)
		}
		if !adm.Allowed {
			break
		}
	}
	if adm.Allowed || adm.Resource != resourceLedger || !strings.Contains(adm.Reason, `TenantQuota "team-a" has too many claims admitted whose creates are not yet seen`) {
		t.Fatalf("after %d claims: %+v, want a refusal for the book's size", i, adm.Decision)
	}
	var books corev1.ConfigMapList
	if err := api.List(ctx(t), &books, client.InNamespace("gpuaas")); err != nil {
		t.Fatal(err)
	}
	for _, b := range books.Items {
		if n := len(b.Data[ledgerDataKey]); n > maxTenantBookBytes {
			t.Errorf("book %s is %d bytes, over the tenant's cap %d", b.Name, n, maxTenantBookBytes)
		}
	}
	t.Logf("refused after %d claims: %s", i, adm.Reason)
}

// sizeBound is never below the encoded size, or the caps would not hold.
func TestReservationSizeBound(t *testing.T) {
	c := quota.Charge{Units: quota.NewUnits(3, 7), Memory: 1 << 62, Devices: map[string]int64{"h100": 1 << 62, "mig-1g": -5}}
	r := newReservation(types.NamespacedName{Namespace: strings.Repeat("n", 63), Name: strings.Repeat("x", 253)},
		"0f2d1c1e-1111-2222-3333-444455556666", c, time.Date(2026, 12, 31, 23, 59, 59, 999999999, time.FixedZone("", -13*3600)))
	raw, err := json.Marshal([]reservation{r, r})
	if err != nil {
		t.Fatal(err)
	}
	if 2*r.sizeBound() < len(raw) {
		t.Errorf("bound %d for 2 entries, encoded %d bytes", 2*r.sizeBound(), len(raw))
	}
}

// Issue 26 item 3, through admission: allocationMode All of a profile no
// node publishes yet took the whole next node; it is refused, and no
// overrule lifts that.
func TestAdmitRefusesAllBeforeDevicesExist(t *testing.T) {
	p := gpuProfile("mig-3g", gpuaas.ProfileSelector{MigProfile: "3g.40gb"})
	acct, _ := newAccountant(t, append(world(t), p, classOf(t, p), ns("a", nil), teamQuota("team-a", "a", "100"))...)
	c := claim("a", "all", "mig-3g", 0)
	c.Spec.Devices.Requests[0].Exactly.AllocationMode = resourceapi.DeviceAllocationModeAll
	adm, err := acct.Admit(ctx(t), c, false)
	if err != nil || adm.Allowed || adm.Resource != quota.ResourceUnpriced || !strings.Contains(adm.Reason, "allocationMode All") {
		t.Fatalf("%+v, %v: want refused as unpriced", adm.Decision, err)
	}
	adm, err = acct.admitOverruled(ctx(t), c, false, overruling{by: "Kueue", classes: sets.New("mig-3g")})
	if err != nil || adm.Allowed {
		t.Fatalf("overruled: %+v, %v", adm.Decision, err)
	}
	if adm, _ := acct.Admit(ctx(t), claim("a", "one", "mig-1g", 1), false); !adm.Allowed {
		t.Errorf("a priced claim refused: %s", adm.Reason)
	}
}

// A profile whose DeviceClass the controller has not rendered yet is priced
// by its selector, not at the fallback of a whole GPU.
func TestAdmitPricesProfileBeforeItsClass(t *testing.T) {
	p := gpuProfile("mig-fresh", gpuaas.ProfileSelector{MigProfile: "1g.10gb"})
	acct, _ := newAccountant(t, append(world(t), p, ns("a", nil), teamQuota("team-a", "a", "0.2"))...)
	adm, err := acct.Admit(ctx(t), claim("a", "x", "mig-fresh", 1), false)
	if err != nil || !adm.Allowed || adm.Cost.Units.String() != "1/7 (~0.143)" {
		t.Fatalf("admission %+v (cost %s), err %v", adm.Decision, adm.Cost, err)
	}
}

// Usage is rebuilt from the API: a fresh accountant (a restarted
// controller) reports the same usage and makes the same decisions.
func TestUsageSurvivesRestart(t *testing.T) {
	objs := append(world(t), ns("a", nil), teamQuota("team-a", "a", "2"),
		allocatedTo(claim("a", "mig", "mig-1g", 2), "node-b", "gpu-0-mig-1g-0", "gpu-0-mig-1g-1"),
		claim("a", "pending", "h100", 1))
	for i := range 2 {
		acct, _ := newAccountant(t, objs...)
		rep, err := acct.Report(ctx(t), "team-a")
		if err != nil {
			t.Fatal(err)
		}
		if rep.Usage.Used.Units.String() != "2/7 (~0.286)" || rep.Usage.Reserved.Units.String() != "1" || rep.Usage.Claims != 2 {
			t.Fatalf("run %d: used %s reserved %s claims %d", i, rep.Usage.Used.Units, rep.Usage.Reserved.Units, rep.Usage.Claims)
		}
	}
}

// The catalog snapshot is rebuilt when slices change: a claim priced at the
// fallback (no device yet) is priced at the device once published.
func TestInvalidateCatalog(t *testing.T) {
	future := gpuProfile("mig-3g", gpuaas.ProfileSelector{MigProfile: "3g.40gb"})
	acct, c := newAccountant(t, append(world(t), future, classOf(t, future), ns("a", nil), teamQuota("team-a", "a", "1"),
		claim("a", "big", "mig-3g", 1))...)
	rep, _ := acct.Report(ctx(t), "team-a")
	if got := rep.Usage.Reserved.Units.String(); got != "1" {
		t.Fatalf("before MIG is published: reserved %s, want the fallback 1", got)
	}
	d := mig1g(0)
	d.Name = "gpu-1-mig-3g"
	d.Attributes["profile"], d.Attributes["computeSlices"] = attr("3g.40gb"), intAttr(3)
	if err := c.Create(ctx(t), resourceSlice("node-c", d)); err != nil {
		t.Fatal(err)
	}
	acct.InvalidateCatalog()
	rep, _ = acct.Report(ctx(t), "team-a")
	if got := rep.Usage.Reserved.Units.String(); got != "3/7 (~0.429)" {
		t.Fatalf("after: reserved %s, want 3/7", got)
	}
}

// nicClass is another driver's DeviceClass.
func nicClass() *resourceapi.DeviceClass {
	return &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "nic.example.com"},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
			Expression: `device.driver == "nic.example.com"`}}}}}
}

// Issue 35: where no device of a profile is published (dynamic MIG on a
// cluster without partitionable devices, 1.34 and 1.35 by default), its
// claim is priced as a whole GPU, so a small quota refuses it. The refusal
// says so, or the tenant reads only "requested 1" for a 1/7 slice.
func TestAdmitSaysAGuessedPriceIsAGuess(t *testing.T) {
	p := gpuProfile("mig-3g", gpuaas.ProfileSelector{MigProfile: "3g.40gb"})
	acct, _ := newAccountant(t, append(world(t), p, classOf(t, p), ns("a", nil), teamQuota("team-a", "a", "0.5"))...)
	adm, err := acct.Admit(ctx(t), claim("a", "x", "mig-3g", 1), false)
	if err != nil || adm.Allowed {
		t.Fatalf("%+v, %v: want refused at the fallback price of a whole GPU", adm.Decision, err)
	}
	if !strings.Contains(adm.Reason, `no published device matches class "mig-3g"`) {
		t.Errorf("refusal %q does not say that the price is a guess", adm.Reason)
	}
	adm, err = acct.Admit(ctx(t), claim("a", "y", "mig-1g", 1), false)
	if err != nil || !adm.Allowed {
		t.Fatalf("a claim priced by a published device: %+v, %v", adm.Decision, err)
	}
	adm, _ = acct.Admit(ctx(t), claim("a", "z", "h100", 1), false)
	if adm.Allowed || strings.Contains(adm.Reason, "no published device") {
		t.Errorf("a claim priced by a published H100: %+v; want refused without a word of guessing", adm.Decision)
	}
}
