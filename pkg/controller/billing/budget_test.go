package billing

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
)

func budgetQuota(amount string, action gpuaas.BudgetAction, thresholds ...int32) *gpuaas.TenantQuota {
	return &gpuaas.TenantQuota{ObjectMeta: metav1.ObjectMeta{Name: "team-a", Generation: 1},
		Spec: gpuaas.TenantQuotaSpec{Namespaces: []string{"ns-a"},
			Budget: &gpuaas.Budget{Amount: qty(amount), Thresholds: thresholds, Action: action}}}
}

func quotaIn(t *testing.T, c client.Reader) *gpuaas.TenantQuota {
	t.Helper()
	var q gpuaas.TenantQuota
	if err := c.Get(ctx(t), key("team-a"), &q); err != nil {
		t.Fatal(err)
	}
	return &q
}

// drain is the events raised since the last drain.
func drain(rec *events.FakeRecorder) []string {
	var out []string
	for {
		select {
		case e := <-rec.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

// TestBudgetThresholds: a whole GPU at 3.60 an hour against a budget of 10
// crosses 50% at 83 minutes, 80% at 133 and 100% at 167: each threshold
// sets the conditions and raises one event, once, across a leader change.
func TestBudgetThresholds(t *testing.T) {
	clk := newClock()
	api := newAPI(t, profile("whole", "3.60"), allocated("c1", "whole", "whole-0"),
		budgetQuota("10", gpuaas.BudgetActionRefuseNewClaims, 50, 80, 100))
	r := newRecorder(api, clk)
	fake := events.NewFakeRecorder(20)
	r.Events = fake
	step := func(to time.Duration, wantPercent int64, wantEvents ...string) {
		t.Helper()
		clk.t = at(to)
		reconcileOK(t, r)
		st := quotaIn(t, api).Status.Budget
		if st == nil || st.Percent != wantPercent || st.Period != "2026-03" || st.Currency != "USD" {
			t.Fatalf("at %v: budget status %+v, want %d%%", to, st, wantPercent)
		}
		got := drain(fake)
		if len(got) != len(wantEvents) {
			t.Fatalf("at %v: events %q, want %d", to, got, len(wantEvents))
		}
		for i, want := range wantEvents {
			if !strings.Contains(got[i], want) {
				t.Errorf("at %v: event %q lacks %q", to, got[i], want)
			}
		}
	}
	step(0, 0)
	step(60*time.Minute, 36)
	step(84*time.Minute, 50, "Normal BudgetThresholdCrossed TenantQuota team-a crossed 50% of its budget for 2026-03: spent 5.040000 USD of 10")
	step(90*time.Minute, 54)
	step(134*time.Minute, 80, "crossed 80%")
	q := quotaIn(t, api)
	if c := meta.FindStatusCondition(q.Status.Conditions, gpuaas.ConditionBudgetThresholdReached); c == nil ||
		c.Status != metav1.ConditionTrue || !strings.Contains(c.Message, "threshold 80% reached") {
		t.Errorf("BudgetThresholdReached = %+v", c)
	}
	if c := meta.FindStatusCondition(q.Status.Conditions, gpuaas.ConditionBudgetExhausted); c == nil || c.Status != metav1.ConditionFalse {
		t.Errorf("BudgetExhausted before 100%% = %+v", c)
	}

	// A new leader reads the status: no event again for 50 and 80.
	r = newRecorder(api, clk)
	r.Events = fake
	step(140*time.Minute, 84)
	step(167*time.Minute, 100, "Warning BudgetExhausted TenantQuota team-a crossed 100%")
	step(200*time.Minute, 120)
	q = quotaIn(t, api)
	c := meta.FindStatusCondition(q.Status.Conditions, gpuaas.ConditionBudgetExhausted)
	if c == nil || c.Status != metav1.ConditionTrue || !strings.Contains(c.Message, "new claims are refused") {
		t.Errorf("BudgetExhausted = %+v", c)
	}
	if got := q.Status.Budget.ThresholdsCrossed; len(got) != 3 {
		t.Errorf("thresholds crossed %v", got)
	}
	m := r.budgetMetrics()["team-a"]
	if m.amount == nil || m.spent.FloatString(2) != "12.00" || m.amount.FloatString(0) != "10" || len(m.thresholds) != 3 {
		t.Errorf("budget metrics %+v", m)
	}

	// The next month starts at zero: the conditions go False, the
	// thresholds are crossed (and raise their events) anew.
	clk.t = time.Date(2026, 4, 1, 0, 30, 0, 0, time.UTC)
	reconcileOK(t, r)
	q = quotaIn(t, api)
	if st := q.Status.Budget; st.Period != "2026-04" || st.Percent != 18 || len(st.ThresholdsCrossed) != 0 {
		t.Errorf("new period: %+v", st)
	}
	if c := meta.FindStatusCondition(q.Status.Conditions, gpuaas.ConditionBudgetExhausted); c.Status != metav1.ConditionFalse {
		t.Errorf("BudgetExhausted in the new period = %+v", c)
	}
	if got := drain(fake); len(got) != 0 {
		t.Errorf("events at the new period's start: %q", got)
	}
}

// A budget removed takes its status and conditions with it.
func TestBudgetRemoved(t *testing.T) {
	clk := newClock()
	api := newAPI(t, profile("whole", "3.60"), allocated("c1", "whole", "whole-0"), budgetQuota("1", gpuaas.BudgetActionNotify))
	r := newRecorder(api, clk)
	reconcileOK(t, r)
	clk.t = at(time.Hour)
	reconcileOK(t, r)
	q := quotaIn(t, api)
	if c := meta.FindStatusCondition(q.Status.Conditions, gpuaas.ConditionBudgetExhausted); c == nil ||
		c.Status != metav1.ConditionTrue || !strings.Contains(c.Message, "action Notify") {
		t.Fatalf("BudgetExhausted = %+v", c)
	}
	q.Spec.Budget = nil
	if err := api.Update(ctx(t), q); err != nil {
		t.Fatal(err)
	}
	reconcileOK(t, r)
	q = quotaIn(t, api)
	if q.Status.Budget != nil || meta.FindStatusCondition(q.Status.Conditions, gpuaas.ConditionBudgetExhausted) != nil {
		t.Errorf("budget removed, status kept: %+v", q.Status)
	}
	if _, ok := r.budgetMetrics()["team-a"]; ok {
		t.Error("budget removed, its metrics kept")
	}
}

// TestIdleHeld: the units of devices the plugin reports Idle=True, and
// their cost per hour, per tenant; a tenant with none idle reads zero.
func TestIdleHeld(t *testing.T) {
	clk := newClock()
	busy := allocated("busy", "whole", "whole-0")
	idle := allocated("idle", "whole", "whole-1", "slice-0")
	for _, d := range idle.Status.Allocation.Devices.Results {
		idle.Status.Devices = append(idle.Status.Devices, resourceapi.AllocatedDeviceStatus{Driver: d.Driver, Pool: d.Pool, Device: d.Device,
			Conditions: []metav1.Condition{{Type: gpuaas.DeviceConditionIdle, Status: metav1.ConditionTrue, Reason: "Idle", LastTransitionTime: metav1.NewTime(t0)}}})
	}
	idle.Status.Devices[1].Conditions[0].Status = metav1.ConditionFalse // the slice is in use
	api := newAPI(t, profile("whole", "7"), busy, idle)
	r := newRecorder(api, clk)
	reconcileOK(t, r)
	got := r.idleNow()["team-a"]
	if got.units == nil || got.units.RatString() != "1" || got.costPerHour.RatString() != "7" {
		t.Fatalf("idle held %+v", got)
	}
	deleteClaim(t, api, "idle")
	reconcileOK(t, r)
	if got := r.idleNow()["team-a"]; got.units == nil || got.units.Sign() != 0 {
		t.Errorf("nothing idle: %+v", got)
	}
}

// The spend grows at every reconcile; the quota's status is written only
// when the percent (or anything else) changes, not at each reconcile.
func TestBudgetStatusWrittenPerPercent(t *testing.T) {
	clk := newClock()
	api := newAPI(t, profile("whole", "3.60"), allocated("c1", "whole", "whole-0"), budgetQuota("10", gpuaas.BudgetActionNotify))
	r := newRecorder(api, clk)
	reconcileOK(t, r)
	versions := map[string]bool{}
	for s := 0; s < 90; s += 10 { // 0.09% of the budget in 90 s
		clk.t = at(time.Duration(s) * time.Second)
		reconcileOK(t, r)
		versions[quotaIn(t, api).ResourceVersion] = true
	}
	if len(versions) != 1 {
		t.Errorf("status written %d times within one percent", len(versions))
	}
	clk.t = at(110 * time.Minute) // 66%
	reconcileOK(t, r)
	if st := quotaIn(t, api).Status.Budget; st.Percent != 66 || st.Spent != "6.600000" {
		t.Errorf("after a percent: %+v", st)
	}
}

// TestABudgetWriteBehindAnotherWriterIsNoReconcileError: the quota
// reconciler writes a TenantQuota's status too, and while a tenant's claims
// move it does so often, so the budget's status write can meet a newer
// status however often it reads the live object again. That is no
// reconcile error (TestRealNodePrometheus saw GpuaasControllerReconcileErrors
// fire for controller=billing from two conflicts in a row): the reconcile
// comes back soon and writes the status then, with its threshold events
// raised once. A refusal of another kind is still an error.
func TestABudgetWriteBehindAnotherWriterIsNoReconcileError(t *testing.T) {
	clk := newClock()
	base := newAPI(t, profile("whole", "3.60"), allocated("c1", "whole", "whole-0"), budgetQuota("1", gpuaas.BudgetActionNotify))
	var refuse error
	api := interceptor.NewClient(base, interceptor.Funcs{
		SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
			if _, ok := obj.(*gpuaas.TenantQuota); ok && refuse != nil {
				return refuse
			}
			return c.SubResource(sub).Update(ctx, obj, opts...)
		},
	})
	r := newRecorder(api, clk)
	fake := events.NewFakeRecorder(20)
	r.Events = fake
	reconcileOK(t, r)     // the record starts: nothing spent yet
	clk.t = at(time.Hour) // 3.60 spent of 1: past every threshold
	refuse = apierrors.NewConflict(schema.GroupResource{Group: gpuaas.GroupName, Resource: "tenantquotas"}, "team-a", errors.New("the object has been modified"))
	res, err := r.Reconcile(ctx(t), everything)
	if err != nil {
		t.Fatalf("a budget status behind another writer's: reconcile error %v", err)
	}
	if res.RequeueAfter <= 0 || res.RequeueAfter >= r.Resync {
		t.Errorf("requeued after %v, want soon (before the resync, %v)", res.RequeueAfter, r.Resync)
	}
	if st := quotaIn(t, base).Status.Budget; st == nil || st.Percent != 0 || len(drain(fake)) != 0 {
		t.Fatalf("nothing was written, yet the status moved (%+v) or an event was raised", st)
	}

	refuse = nil
	reconcileOK(t, r)
	if st := quotaIn(t, base).Status.Budget; st == nil || st.Percent != 360 {
		t.Fatalf("budget status once the writes land: %+v", st)
	}
	if got := drain(fake); len(got) != 3 {
		t.Errorf("threshold events once written: %q, want one each for 50, 80 and 100%%", got)
	}

	clk.t = at(2 * time.Hour)
	refuse = apierrors.NewForbidden(schema.GroupResource{Group: gpuaas.GroupName, Resource: "tenantquotas"}, "team-a", errors.New("no"))
	if _, err := r.Reconcile(ctx(t), everything); err == nil {
		t.Error("a forbidden budget status write was no reconcile error")
	}
}
