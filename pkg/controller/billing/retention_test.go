package billing

import (
	"context"
	"errors"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
)

// closedMonth is team-a's TenantUsage of a past month: one hour of a
// whole GPU at 1 an hour, 600 s of it idle.
func closedMonth(period string) *gpuaas.TenantUsage {
	start, _ := time.Parse("2006-01", period)
	u := newUsage("team-a", start, "USD")
	u.Status.Totals = []gpuaas.UsageTotal{{Profile: "whole", GpuModel: "NVIDIA H100 80GB HBM3", Node: "node-a", Price: resource.MustParse("1"),
		Records: 1, UnitSeconds: "3600", UsedUnitSeconds: "3000", IdleUnitSeconds: "600", UnknownUseUnitSeconds: "0", Cost: "1.000000"}}
	summarize(u)
	return u
}

func exists(t *testing.T, c client.Reader, name string) bool {
	t.Helper()
	err := c.Get(ctx(t), key(name), &gpuaas.TenantUsage{})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	return err == nil
}

func wantMonths(t *testing.T, c client.Reader, kept, deleted []string) {
	t.Helper()
	for _, p := range kept {
		if !exists(t, c, UsageName("team-a", p)) {
			t.Errorf("%s deleted, want it kept", p)
		}
	}
	for _, p := range deleted {
		if exists(t, c, UsageName("team-a", p)) {
			t.Errorf("%s kept, want it deleted", p)
		}
	}
}

// TestRetentionDeletesOnlyExpiredMonths: with a retention of 13 months
// the leader deletes the months that ended more than 13 months before the
// current one, never the current or the previous month, even at a
// retention of 1; the counters keep what the deleted months held; 0 keeps
// everything.
func TestRetentionDeletesOnlyExpiredMonths(t *testing.T) {
	months := []string{"2025-01", "2025-02", "2026-01", "2026-02"}
	var objs []client.Object
	for _, p := range months {
		objs = append(objs, closedMonth(p))
	}
	api := newAPI(t, append(objs, profile("whole", "1"), allocated("train", "whole", "whole-0"))...)
	clk := newClock() // 2026-03-10

	forever := newRecorder(api, clk)
	reconcileOK(t, forever)
	wantMonths(t, api, months, nil)

	r := newRecorder(api, clk)
	r.RetentionMonths = 13
	reconcileOK(t, r)
	wantMonths(t, api, []string{"2025-02", "2026-01", "2026-02", "2026-03"}, []string{"2025-01"})
	perTenant, _, cost, _ := r.Totals()
	if got := units(perTenant["team-a"]); got != "14400" {
		t.Errorf("unit-seconds counter after the deletion %s, want 14400 (four months of 3600, the open record at 0 s)", got)
	}
	if got := cost[costKey{"team-a", "whole", "NVIDIA H100 80GB HBM3"}].FloatString(6); got != "4.000000" {
		t.Errorf("cost counter after the deletion %s, want 4.000000", got)
	}
	if idle, deleted := r.idleTotals(); idle[costKey{"team-a", "whole", "NVIDIA H100 80GB HBM3"}].RatString() != "2400" || deleted["team-a"] != 1 {
		t.Errorf("idle counter %v, deleted %v; want 2400 and 1", idle, deleted)
	}

	r.RetentionMonths = 1
	clk.advance(time.Hour)
	reconcileOK(t, r)
	wantMonths(t, api, []string{"2026-02", "2026-03"}, []string{"2025-02", "2026-01"})

	clk.t = time.Date(2026, 4, 1, 0, 0, 30, 0, time.UTC) // the claim still held: March rolls over
	reconcileOK(t, r)
	wantMonths(t, api, []string{"2026-03", "2026-04"}, []string{"2026-02"})
	perTenant, _, _, _ = r.Totals()
	// four months of 3600, and March's open record: 21 days, 12 hours
	// and 30 s.
	if got, want := units(perTenant["team-a"]), "1872030"; got != want {
		t.Errorf("unit-seconds counter %s, want %s", got, want)
	}
}

// TestRetentionDeleteFailingIsRetried: a refused delete is reported and
// tried again; nothing is forgotten meanwhile.
func TestRetentionDeleteFailingIsRetried(t *testing.T) {
	base := newAPI(t, closedMonth("2025-01"))
	refuse := true
	api := interceptor.NewClient(base, interceptor.Funcs{
		Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
			if refuse {
				return errors.New("the API server is down")
			}
			return c.Delete(ctx, obj, opts...)
		},
	})
	clk := newClock()
	r := newRecorder(api, clk)
	r.RetentionMonths = 13
	if _, err := r.Reconcile(ctx(t), everything); err == nil {
		t.Fatal("want the failed delete reported (retried)")
	}
	if len(r.Snapshot()) != 1 || !exists(t, base, UsageName("team-a", "2025-01")) {
		t.Fatal("a month not deleted was forgotten")
	}
	refuse = false
	reconcileOK(t, r)
	wantMonths(t, base, nil, []string{"2025-01"})
	if perTenant, _, _, _ := r.Totals(); units(perTenant["team-a"]) != "3600" {
		t.Errorf("counter %v, want 3600", perTenant)
	}
}

// TestNoDeletionIsAValue: a tenant with records and none deleted has the
// deletions' series at 0 (the operator dashboard's panel and
// TestRealNodePrometheus read it), not an absent one.
func TestNoDeletionIsAValue(t *testing.T) {
	api := newAPI(t, profile("whole", "1"), allocated("train", "whole", "whole-0"))
	r := newRecorder(api, newClock())
	reconcileOK(t, r)
	_, deleted := r.idleTotals()
	if n, ok := deleted["team-a"]; len(deleted) != 1 || !ok || n != 0 {
		t.Errorf("deletions per tenant %v, want team-a's present at 0", deleted)
	}
}
