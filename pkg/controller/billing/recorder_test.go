package billing

import (
	"context"
	"errors"
	"math/big"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2/ktesting"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller/internal/testworld"
	"github.com/gpuaas/gpu-dra-driver/pkg/quota"
)

const driver = "gpu.gpuaas.io"

// t0 is mid-month, so that only the rollover test crosses a period.
var t0 = time.Date(2026, 3, 10, 12, 0, 0, 0, time.UTC)

// meter charges a device "whole-N" one unit and "slice-N" 1/7, of model
// H100, to the tenant of the claim's namespace.
type meter struct{ tenants map[string]string }

func (m meter) Holdings(_ context.Context, claim *resourceapi.ResourceClaim) (string, []quota.Held, error) {
	var out []quota.Held
	for _, res := range claim.Status.Allocation.Devices.Results {
		units := quota.WholeUnits(1)
		if res.Device[:5] == "slice" {
			units = quota.NewUnits(1, 7)
		}
		out = append(out, quota.Held{Request: res.Request, Class: claim.Spec.Devices.Requests[0].Exactly.DeviceClassName,
			Device: quota.DeviceID{Driver: driver, Pool: res.Pool, Device: res.Device}, Model: "NVIDIA H100 80GB HBM3",
			Charge: quota.Charge{Units: units, Memory: 10 << 30}})
	}
	return m.tenants[claim.Namespace], out, nil
}

// clock is the test's time, moved by hand.
type clock struct{ t time.Time }

func (c *clock) now() time.Time          { return c.t }
func (c *clock) advance(d time.Duration) { c.t = c.t.Add(d) }
func at(d time.Duration) time.Time       { return t0.Add(d) }
func ctx(t *testing.T) context.Context   { _, c := ktesting.NewTestContext(t); return c }
func units(us *big.Rat) string           { return us.RatString() }
func qty(s string) resource.Quantity     { return resource.MustParse(s) }
func newClock() *clock                   { return &clock{t: t0} }
func key(name string) client.ObjectKey   { return client.ObjectKey{Name: name} }
func usageName() string                  { return UsageName("team-a", "2026-03") }
func priceOf(s string) *gpuaas.Price     { return &gpuaas.Price{PerGpuUnitHour: qty(s)} }
func profile(name, price string) *gpuaas.GpuProfile {
	p := &gpuaas.GpuProfile{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if price != "" {
		p.Spec.Price = priceOf(price)
	}
	return p
}

func newAPI(t *testing.T, objs ...client.Object) client.WithWatch {
	t.Helper()
	s, err := testworld.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	return fake.NewClientBuilder().WithScheme(s).WithObjects(objs...).
		WithStatusSubresource(&gpuaas.TenantUsage{}, &resourceapi.ResourceClaim{}, &gpuaas.TenantQuota{}).Build()
}

// newRecorder is a leader starting: nothing in memory, the API's records.
func newRecorder(c client.Client, clk *clock) *Recorder {
	return &Recorder{Client: c, Live: c, Meter: meter{tenants: map[string]string{"ns-a": "team-a"}},
		Currency: "USD", Resync: 30 * time.Second, Now: clk.now}
}

// allocated is a claim of class "whole" (or the class given) in ns-a
// holding the devices named.
func allocated(name, class string, devices ...string) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns-a", Name: name, UID: types.UID("uid-" + name)},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: class}}}}},
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{},
			ReservedFor: []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "pod-" + name, UID: "p"}}},
	}
	for _, d := range devices {
		c.Status.Allocation.Devices.Results = append(c.Status.Allocation.Devices.Results,
			resourceapi.DeviceRequestAllocationResult{Request: "gpu", Driver: driver, Pool: "node-a", Device: d})
	}
	return c
}

func reconcileOK(t *testing.T, r *Recorder) {
	t.Helper()
	if _, err := r.Reconcile(ctx(t), everything); err != nil {
		t.Fatalf("reconcile: %v", err)
	}
}

func deleteClaim(t *testing.T, c client.Client, name string) {
	t.Helper()
	if err := c.Delete(ctx(t), &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns-a", Name: name}}); err != nil {
		t.Fatal(err)
	}
}

func usageIn(t *testing.T, c client.Reader, name string) *gpuaas.TenantUsage {
	t.Helper()
	var u gpuaas.TenantUsage
	if err := c.Get(ctx(t), key(name), &u); err != nil {
		t.Fatalf("reading TenantUsage %s: %v", name, err)
	}
	return &u
}

// closedIn are the closed records of u by claim/device.
func closedIn(u *gpuaas.TenantUsage) map[string]gpuaas.UsageRecord {
	out := map[string]gpuaas.UsageRecord{}
	for _, rec := range u.Status.Recent {
		out[rec.Claim+"/"+rec.Device] = rec
	}
	return out
}

func wantRecord(t *testing.T, rec gpuaas.UsageRecord, start, end time.Time, unitSeconds, cost string) {
	t.Helper()
	if !rec.Start.Time.Equal(start) || rec.End == nil || !rec.End.Time.Equal(end) {
		t.Errorf("record %s/%s: [%v, %v), want [%v, %v)", rec.Claim, rec.Device, rec.Start.Time, rec.End, start, end)
	}
	if rec.UnitSeconds != unitSeconds || rec.Cost != cost {
		t.Errorf("record %s/%s: %s unit-seconds costing %s, want %s costing %s", rec.Claim, rec.Device, rec.UnitSeconds, rec.Cost, unitSeconds, cost)
	}
}

// wantCounterMatches: the derived counter is the records' total, and the
// TenantUsage's own.
func wantCounterMatches(t *testing.T, r *Recorder, api client.Reader, want string) {
	t.Helper()
	perTenant, _, _, _ := r.Totals()
	if got := units(perTenant["team-a"]); got != want {
		t.Errorf("gpu-unit-seconds counter: %s, want %s", got, want)
	}
	if got := usageIn(t, api, usageName()).Status.UnitSeconds; got != want {
		t.Errorf("TenantUsage unitSeconds: %s, want %s", got, want)
	}
}

func TestRecordPerAllocationExact(t *testing.T) {
	api := newAPI(t, profile("whole", "2.50"), allocated("train", "whole", "whole-0", "slice-1"))
	clk := newClock()
	r := newRecorder(api, clk)
	reconcileOK(t, r)
	u := usageIn(t, api, usageName())
	if len(u.Status.Open) != 2 || !u.Status.Open[0].Start.Time.Equal(t0) {
		t.Fatalf("want two open records started at %v, got %+v", t0, u.Status.Open)
	}
	clk.advance(30 * time.Second)
	reconcileOK(t, r) // a resync: lastSeen checkpointed
	if got := usageIn(t, api, usageName()).Status.Open[0].LastSeen.Time; !got.Equal(at(30 * time.Second)) {
		t.Errorf("lastSeen %v, want %v", got, at(30*time.Second))
	}
	clk.advance(70 * time.Second)
	deleteClaim(t, api, "train")
	reconcileOK(t, r)
	u = usageIn(t, api, usageName())
	closed := closedIn(u)
	// 100 s of one unit at 2.50/h, and of 1/7 unit.
	wantRecord(t, closed["train/node-a/whole-0"], t0, at(100*time.Second), "100", "0.069444")
	wantRecord(t, closed["train/node-a/slice-1"], t0, at(100*time.Second), "100/7", "0.009921")
	rec := closed["train/node-a/whole-0"]
	if rec.Tenant != "team-a" || rec.Namespace != "ns-a" || rec.Profile != "whole" || rec.GpuModel != "NVIDIA H100 80GB HBM3" ||
		rec.Node != "node-a" || rec.Units != "1" || rec.Price.Cmp(qty("2.50")) != 0 || len(rec.Pods) != 1 || rec.Pods[0] != "pod-train" {
		t.Errorf("record says %+v", rec)
	}
	if len(u.Status.Open) != 0 || len(u.Status.Totals) != 1 || u.Status.Totals[0].Records != 2 {
		t.Errorf("want both records closed into one total, got open %d, totals %+v", len(u.Status.Open), u.Status.Totals)
	}
	wantCounterMatches(t, r, api, "800/7")
}

// The leader is killed (its memory lost, nothing written after its last
// checkpoint) and a new one starts from the API's TenantUsage while the
// claim is still allocated: the record goes on from its start, billed
// once.
func TestNewLeaderBillsNothingTwiceLosesNothing(t *testing.T) {
	api := newAPI(t, profile("whole", "1"), allocated("train", "whole", "whole-0"))
	clk := newClock()
	old := newRecorder(api, clk)
	reconcileOK(t, old)
	clk.advance(30 * time.Second)
	reconcileOK(t, old)
	clk.advance(25 * time.Second) // killed 25 s after its last checkpoint: its memory is lost
	clk.advance(35 * time.Second) // no leader for 35 s
	next := newRecorder(api, clk)
	reconcileOK(t, next)
	clk.advance(30 * time.Second)
	deleteClaim(t, api, "train")
	reconcileOK(t, next)
	u := usageIn(t, api, usageName())
	wantRecord(t, closedIn(u)["train/node-a/whole-0"], t0, at(120*time.Second), "120", "0.033333")
	if closedIn(u)["train/node-a/whole-0"].EndUncertain {
		t.Error("the claim was seen going: its end is certain")
	}
	wantCounterMatches(t, next, api, "120")
}

// The claim goes while no leader runs: its record ends at the last
// observation, uncertain, and says until when.
func TestClaimGoneWhileNoLeaderClosesAtLastSeen(t *testing.T) {
	api := newAPI(t, profile("whole", ""), allocated("train", "whole", "whole-0"))
	clk := newClock()
	old := newRecorder(api, clk)
	reconcileOK(t, old)
	clk.advance(30 * time.Second)
	reconcileOK(t, old)
	clk.advance(40 * time.Second)
	deleteClaim(t, api, "train")
	clk.advance(30 * time.Second)
	next := newRecorder(api, clk)
	reconcileOK(t, next)
	rec := closedIn(usageIn(t, api, usageName()))["train/node-a/whole-0"]
	wantRecord(t, rec, t0, at(30*time.Second), "30", "0.000000")
	if !rec.EndUncertain || rec.UncertainUntil == nil || !rec.UncertainUntil.Time.Equal(at(100*time.Second)) {
		t.Errorf("want the end uncertain until %v, got %v %v", at(100*time.Second), rec.EndUncertain, rec.UncertainUntil)
	}
	wantCounterMatches(t, next, api, "30")
}

// A price changed while the claim runs: the record is split there, each
// part at its price.
func TestPriceChangeSplitsTheRecord(t *testing.T) {
	p := profile("whole", "2.50")
	api := newAPI(t, p, allocated("train", "whole", "whole-0"))
	clk := newClock()
	r := newRecorder(api, clk)
	reconcileOK(t, r)
	clk.advance(time.Hour)
	p = &gpuaas.GpuProfile{}
	if err := api.Get(ctx(t), key("whole"), p); err != nil {
		t.Fatal(err)
	}
	p.Spec.Price = priceOf("4")
	if err := api.Update(ctx(t), p); err != nil {
		t.Fatal(err)
	}
	reconcileOK(t, r)
	clk.advance(time.Hour)
	deleteClaim(t, api, "train")
	reconcileOK(t, r)
	u := usageIn(t, api, usageName())
	if len(u.Status.Recent) != 2 {
		t.Fatalf("want two records, got %+v", u.Status.Recent)
	}
	wantRecord(t, u.Status.Recent[0], t0, at(time.Hour), "3600", "2.500000")
	wantRecord(t, u.Status.Recent[1], at(time.Hour), at(2*time.Hour), "3600", "4.000000")
	if u.Status.Recent[0].Price.Cmp(qty("2.50")) != 0 || u.Status.Recent[1].Price.Cmp(qty("4")) != 0 {
		t.Errorf("records priced %v and %v, want 2.50 and 4", u.Status.Recent[0].Price, u.Status.Recent[1].Price)
	}
	if u.Status.Cost != "6.500000" || len(u.Status.Totals) != 2 {
		t.Errorf("period cost %s over %d totals, want 6.500000 over 2", u.Status.Cost, len(u.Status.Totals))
	}
	_, _, cost, currency := r.Totals()
	if got := cost[costKey{"team-a", "whole", "NVIDIA H100 80GB HBM3"}].FloatString(6); got != "6.500000" || currency != "USD" {
		t.Errorf("cost counter %s %s, want 6.500000 USD", got, currency)
	}
	wantCounterMatches(t, r, api, "7200")
}

// The API refuses writes for a while: the records are kept, written once
// it is back, with the times observed.
func TestWritesFailingAreRetriedNothingLost(t *testing.T) {
	base := newAPI(t, profile("whole", "1"), allocated("train", "whole", "whole-0"))
	down := true
	outage := errors.New("the API server is down")
	api := interceptor.NewClient(base, interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			if _, ok := obj.(*gpuaas.TenantUsage); ok && down {
				return outage
			}
			return c.Create(ctx, obj, opts...)
		},
		SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
			if down {
				return outage
			}
			return c.SubResource(sub).Update(ctx, obj, opts...)
		},
	})
	clk := newClock()
	r := newRecorder(api, clk)
	if _, err := r.Reconcile(ctx(t), everything); !errors.Is(err, outage) {
		t.Fatalf("want the outage reported (retried), got %v", err)
	}
	clk.advance(30 * time.Second)
	down = false
	reconcileOK(t, r)
	if got := usageIn(t, base, usageName()).Status.Open[0].Start.Time; !got.Equal(t0) {
		t.Errorf("record written at last starts %v, want %v (when first seen)", got, t0)
	}
	clk.advance(30 * time.Second)
	down = true
	deleteClaim(t, base, "train")
	if _, err := r.Reconcile(ctx(t), everything); !errors.Is(err, outage) {
		t.Fatalf("want the outage reported, got %v", err)
	}
	clk.advance(60 * time.Second)
	down = false
	reconcileOK(t, r)
	wantRecord(t, closedIn(usageIn(t, base, usageName()))["train/node-a/whole-0"], t0, at(60*time.Second), "60", "0.016667")
	wantCounterMatches(t, r, base, "60")
}

// A claim held across the month's end is billed in each month for its
// part.
func TestMonthEndSplitsTheRecord(t *testing.T) {
	api := newAPI(t, profile("whole", "3600"), allocated("train", "whole", "whole-0"))
	clk := &clock{t: time.Date(2026, 3, 31, 23, 59, 0, 0, time.UTC)}
	r := newRecorder(api, clk)
	reconcileOK(t, r)
	clk.advance(90 * time.Second)
	reconcileOK(t, r)
	clk.advance(30 * time.Second)
	deleteClaim(t, api, "train")
	reconcileOK(t, r)
	march := usageIn(t, api, UsageName("team-a", "2026-03"))
	april := usageIn(t, api, UsageName("team-a", "2026-04"))
	if march.Status.UnitSeconds != "60" || april.Status.UnitSeconds != "60" || march.Status.Cost != "60.000000" || april.Status.Cost != "60.000000" {
		t.Errorf("march %s (%s), april %s (%s); want 60 unit-seconds costing 60 each",
			march.Status.UnitSeconds, march.Status.Cost, april.Status.UnitSeconds, april.Status.Cost)
	}
	if len(march.Status.Open)+len(april.Status.Open) != 0 {
		t.Errorf("records still open: %+v %+v", march.Status.Open, april.Status.Open)
	}
	perTenant, _, _, _ := r.Totals()
	if got := units(perTenant["team-a"]); got != "120" {
		t.Errorf("counter %s, want 120", got)
	}
}

// A negative price would make the cost counters go down: it bills at zero.
func TestNegativePriceBillsZero(t *testing.T) {
	api := newAPI(t, profile("whole", "-1"), allocated("train", "whole", "whole-0"))
	clk := newClock()
	r := newRecorder(api, clk)
	reconcileOK(t, r)
	clk.advance(time.Hour)
	reconcileOK(t, r)
	if u := usageIn(t, api, usageName()); u.Status.Cost != "0.000000" || u.Status.UnitSeconds != "3600" {
		t.Errorf("cost %s for %s unit-seconds, want 0.000000 for 3600", u.Status.Cost, u.Status.UnitSeconds)
	}
}
