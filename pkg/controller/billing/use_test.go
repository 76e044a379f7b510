package billing

import (
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
)

// setUse writes the Idle condition the node's plugin would write on the
// claim's device: status True (idle), False (in use) or Unknown, since
// lastTransitionTime ltt.
func setUse(t *testing.T, c client.Client, claim, device string, status metav1.ConditionStatus, ltt time.Time) {
	t.Helper()
	var rc resourceapi.ResourceClaim
	if err := c.Get(ctx(t), client.ObjectKey{Namespace: "ns-a", Name: claim}, &rc); err != nil {
		t.Fatal(err)
	}
	cond := metav1.Condition{Type: gpuaas.DeviceConditionIdle, Status: status, Reason: string(status), LastTransitionTime: metav1.NewTime(ltt)}
	for i := range rc.Status.Devices {
		if rc.Status.Devices[i].Device == device {
			rc.Status.Devices[i].Conditions = []metav1.Condition{cond}
			cond.Type = "" // written
		}
	}
	if cond.Type != "" {
		rc.Status.Devices = append(rc.Status.Devices, resourceapi.AllocatedDeviceStatus{Driver: driver, Pool: "node-a", Device: device,
			Conditions: []metav1.Condition{cond}})
	}
	if err := c.Status().Update(ctx(t), &rc); err != nil {
		t.Fatal(err)
	}
}

// wantUse: the record's used, idle and unknown-use unit-seconds, which
// add up to its unit-seconds.
func wantUse(t *testing.T, what string, rec gpuaas.UsageRecord, used, idle, unknown string) {
	t.Helper()
	if rec.UsedUnitSeconds != used || rec.IdleUnitSeconds != idle || rec.UnknownUseUnitSeconds != unknown {
		t.Errorf("%s: used %s, idle %s, unknown %s unit-seconds; want %s, %s, %s", what,
			rec.UsedUnitSeconds, rec.IdleUnitSeconds, rec.UnknownUseUnitSeconds, used, idle, unknown)
	}
	sum := ratOf(rec.UsedUnitSeconds)
	sum.Add(sum, ratOf(rec.IdleUnitSeconds)).Add(sum, ratOf(rec.UnknownUseUnitSeconds))
	if sum.Cmp(ratOf(rec.UnitSeconds)) != 0 {
		t.Errorf("%s: used + idle + unknown = %s, unit-seconds %s", what, sum.RatString(), rec.UnitSeconds)
	}
}

func idleCounter(r *Recorder, profile string) string {
	idle, _ := r.idleTotals()
	us := idle[costKey{"team-a", profile, "NVIDIA H100 80GB HBM3"}]
	if us == nil {
		return "none"
	}
	return us.RatString()
}

// TestUseSplitsTheRecord: a device's time is split at the Idle
// condition's lastTransitionTime: unknown before any condition, in use,
// idle from the start of the idle run (before the plugin wrote it:
// backdated over time accounted as in use), unknown again, and after the
// last observation as last seen.
func TestUseSplitsTheRecord(t *testing.T) {
	api := newAPI(t, profile("whole", "3.60"), allocated("train", "whole", "whole-0", "slice-0"))
	clk := newClock()
	r := newRecorder(api, clk)
	reconcileOK(t, r) // t0: no condition yet
	clk.advance(30 * time.Second)
	for _, d := range []string{"whole-0", "slice-0"} {
		setUse(t, api, "train", d, metav1.ConditionFalse, at(20*time.Second))
	}
	reconcileOK(t, r)
	clk.advance(60 * time.Second)
	reconcileOK(t, r) // t0+90: a resync, still in use
	clk.advance(10 * time.Second)
	for _, d := range []string{"whole-0", "slice-0"} {
		setUse(t, api, "train", d, metav1.ConditionTrue, at(60*time.Second))
	}
	reconcileOK(t, r) // t0+100
	if got := idleCounter(r, "whole"); got != "320/7" {
		t.Errorf("idle counter at t0+100: %s, want 320/7 (40 s of a whole GPU and of a slice)", got)
	}
	clk.advance(60 * time.Second)
	setUse(t, api, "train", "whole-0", metav1.ConditionUnknown, at(150*time.Second))
	reconcileOK(t, r) // t0+160
	clk.advance(10 * time.Second)
	deleteClaim(t, api, "train")
	reconcileOK(t, r) // t0+170
	u := usageIn(t, api, usageName())
	closed := closedIn(u)
	// unknown [0, 20) and [150, 170), in use [20, 60), idle [60, 150).
	wantUse(t, "whole-0", closed["train/node-a/whole-0"], "40", "90", "40")
	// the slice stayed idle to the end: in use [20, 60), idle [60, 170).
	wantUse(t, "slice-0", closed["train/node-a/slice-0"], "40/7", "110/7", "20/7")
	if closed["train/node-a/whole-0"].Use != "" {
		t.Errorf("a closed record keeps its use state: %q", closed["train/node-a/whole-0"].Use)
	}
	if tot := u.Status.Totals[0]; tot.UsedUnitSeconds != "320/7" || tot.IdleUnitSeconds != "740/7" || tot.UnknownUseUnitSeconds != "300/7" {
		t.Errorf("totals: used %s, idle %s, unknown %s; want 320/7, 740/7, 300/7", tot.UsedUnitSeconds, tot.IdleUnitSeconds, tot.UnknownUseUnitSeconds)
	}
	if s := u.Status; s.UsedUnitSeconds != "320/7" || s.IdleUnitSeconds != "740/7" || s.UnknownUseUnitSeconds != "300/7" || s.UnitSeconds != "1360/7" {
		t.Errorf("status: %s unit-seconds, used %s, idle %s, unknown %s", s.UnitSeconds, s.UsedUnitSeconds, s.IdleUnitSeconds, s.UnknownUseUnitSeconds)
	}
	if got := idleCounter(r, "whole"); got != "740/7" {
		t.Errorf("idle counter %s, want 740/7", got)
	}
}

// TestUseExactAcrossLeaderChange: the leader is killed after a checkpoint
// and a new one starts from the records. A device whose use did not
// change goes on exactly (idle throughout); one whose plugin wrote a
// transition while no leader ran is split at it, the time between the
// last checkpoint and the transition unknown (nobody watched it);
// nothing is counted twice.
func TestUseExactAcrossLeaderChange(t *testing.T) {
	api := newAPI(t, profile("whole", "1"), allocated("train", "whole", "whole-0", "whole-1"))
	setUse(t, api, "train", "whole-0", metav1.ConditionTrue, at(-time.Hour))
	setUse(t, api, "train", "whole-1", metav1.ConditionFalse, at(-time.Minute))
	clk := newClock()
	old := newRecorder(api, clk)
	reconcileOK(t, old)
	clk.advance(30 * time.Second)
	reconcileOK(t, old)           // checkpoint at t0+30
	clk.advance(40 * time.Second) // killed at t0+45, no leader until t0+90
	setUse(t, api, "train", "whole-1", metav1.ConditionTrue, at(40*time.Second))
	clk.advance(20 * time.Second)
	next := newRecorder(api, clk)
	reconcileOK(t, next)
	if got := idleCounter(next, "whole"); got != "140" {
		t.Errorf("the new leader's idle counter: %s, want 140 (90 s and 50 s)", got)
	}
	clk.advance(30 * time.Second)
	reconcileOK(t, next)
	deleteClaim(t, api, "train")
	clk.advance(30 * time.Second)
	reconcileOK(t, next) // t0+150
	closed := closedIn(usageIn(t, api, usageName()))
	wantUse(t, "idle throughout", closed["train/node-a/whole-0"], "0", "150", "0")
	// in use [0, 30), unknown [30, 40), idle [40, 150).
	wantUse(t, "idle while no leader ran", closed["train/node-a/whole-1"], "30", "110", "10")
	wantCounterMatches(t, next, api, "300")
	if got := idleCounter(next, "whole"); got != "260" {
		t.Errorf("idle counter %s, want 260", got)
	}
}

// TestANewLeaderBehindTheOldOnesClockCountsNothingTwice: a new leader
// whose clock is behind the old one's last checkpoint (skew between two
// nodes) neither moves the record's lastSeen back nor accounts the time
// between its clock and that checkpoint a second time.
func TestANewLeaderBehindTheOldOnesClockCountsNothingTwice(t *testing.T) {
	api := newAPI(t, profile("whole", "1"), allocated("train", "whole", "whole-0"))
	setUse(t, api, "train", "whole-0", metav1.ConditionFalse, at(-time.Minute))
	clk := newClock()
	old := newRecorder(api, clk)
	reconcileOK(t, old)
	clk.advance(60 * time.Second)
	reconcileOK(t, old) // checkpoint at t0+60
	behind := &clock{t: t0.Add(40 * time.Second)}
	next := newRecorder(api, behind)
	reconcileOK(t, next) // its clock says t0+40
	if open := usageIn(t, api, usageName()).Status.Open; len(open) != 1 || open[0].LastSeen.Time.Before(t0.Add(60*time.Second)) {
		t.Fatalf("open records after the new leader's first reconcile: %+v; want lastSeen kept at t0+60", open)
	}
	behind.advance(50 * time.Second) // t0+90
	reconcileOK(t, next)
	deleteClaim(t, api, "train")
	reconcileOK(t, next)
	closed := closedIn(usageIn(t, api, usageName()))
	wantUse(t, "in use throughout", closed["train/node-a/whole-0"], "90", "0", "0")

	// Deleted while the new leader's clock is still behind the last
	// checkpoint: closed there, not before it.
	api = newAPI(t, profile("whole", "1"), allocated("train", "whole", "whole-0"))
	setUse(t, api, "train", "whole-0", metav1.ConditionFalse, at(-time.Minute))
	clk = newClock()
	old = newRecorder(api, clk)
	reconcileOK(t, old)
	clk.advance(60 * time.Second)
	reconcileOK(t, old)
	behind = &clock{t: t0.Add(40 * time.Second)}
	next = newRecorder(api, behind)
	reconcileOK(t, next) // seen by the new leader
	deleteClaim(t, api, "train")
	behind.advance(5 * time.Second)
	reconcileOK(t, next) // gone at its t0+45
	rec := closedIn(usageIn(t, api, usageName()))["train/node-a/whole-0"]
	if rec.End == nil || !rec.End.Time.Equal(t0.Add(60*time.Second)) {
		t.Errorf("closed at %v, want at the old leader's last checkpoint t0+60", rec.End)
	}
	wantUse(t, "in use to the checkpoint", rec, "60", "0", "0")
}

// TestUseAcrossMonthEnd: each month's record gets its part of the use; a
// transition after the month's end (backdated to before the reconcile
// that rolled the month over) falls in the new month only.
func TestUseAcrossMonthEnd(t *testing.T) {
	api := newAPI(t, profile("whole", "1"), allocated("train", "whole", "whole-0"))
	end := time.Date(2026, 4, 1, 0, 0, 0, 0, time.UTC)
	setUse(t, api, "train", "whole-0", metav1.ConditionFalse, end.Add(-2*time.Minute))
	clk := &clock{t: end.Add(-time.Minute)}
	r := newRecorder(api, clk)
	reconcileOK(t, r)
	clk.advance(90 * time.Second)
	setUse(t, api, "train", "whole-0", metav1.ConditionTrue, end.Add(10*time.Second))
	reconcileOK(t, r) // 00:00:30
	clk.advance(30 * time.Second)
	deleteClaim(t, api, "train")
	reconcileOK(t, r) // 00:01:00
	march := closedIn(usageIn(t, api, UsageName("team-a", "2026-03")))["train/node-a/whole-0"]
	april := closedIn(usageIn(t, api, UsageName("team-a", "2026-04")))["train/node-a/whole-0"]
	wantUse(t, "march", march, "60", "0", "0")
	wantUse(t, "april", april, "10", "50", "0")
}

// TestUseOfAnOlderRecordIsUnknown: a record written before uses were
// recorded (no use fields) reads as unknown up to its lastSeen, not as in
// use.
func TestUseOfAnOlderRecordIsUnknown(t *testing.T) {
	claim := allocated("train", "whole", "whole-0")
	api := newAPI(t, profile("whole", "1"), claim)
	setUse(t, api, "train", "whole-0", metav1.ConditionFalse, at(-time.Hour))
	clk := newClock()
	old := newRecorder(api, clk)
	reconcileOK(t, old)
	clk.advance(60 * time.Second)
	reconcileOK(t, old)
	u := usageIn(t, api, usageName())
	rec := &u.Status.Open[0]
	rec.Use, rec.UseSince, rec.UsedUnitSeconds, rec.IdleUnitSeconds, rec.UnknownUseUnitSeconds = "", nil, "", "", ""
	if err := api.Status().Update(ctx(t), u); err != nil {
		t.Fatal(err)
	}
	clk.advance(30 * time.Second)
	next := newRecorder(api, clk)
	reconcileOK(t, next)
	deleteClaim(t, api, "train")
	clk.advance(30 * time.Second)
	reconcileOK(t, next)
	wantUse(t, "older record", closedIn(usageIn(t, api, usageName()))["train/node-a/whole-0"], "60", "0", "60")
}

// deallocate clears a claim's allocation, as the resourceclaim controller
// does once its pod is gone (and with it the device statuses).
func deallocate(t *testing.T, c client.Client, claim string) {
	t.Helper()
	var rc resourceapi.ResourceClaim
	if err := c.Get(ctx(t), client.ObjectKey{Namespace: "ns-a", Name: claim}, &rc); err != nil {
		t.Fatal(err)
	}
	rc.Status.Allocation, rc.Status.ReservedFor, rc.Status.Devices = nil, nil, nil
	if err := c.Status().Update(ctx(t), &rc); err != nil {
		t.Fatal(err)
	}
}

// TestUseWrittenInTheSecondOfTheLastReconcile is make demo's use scenario
// as the leader saw it on the real node: the trainer's Idle=False is
// written and reconciled, the notebook's Idle=True (backdated to the start
// of its idle run) is written within the same second and reconciled in it
// too, and no reconcile runs again before the idle policy evicts the
// notebook and its claim is deallocated. Its first runs billed the
// notebook's whole time as unknown use: the second reconcile had no time
// to account (lastSeen already at that second) and dropped the
// transition with it.
func TestUseWrittenInTheSecondOfTheLastReconcile(t *testing.T) {
	api := newAPI(t, profile("whole", "1"), allocated("notebook", "whole", "whole-0"), allocated("trainer", "whole", "whole-1"))
	clk := newClock()
	r := newRecorder(api, clk)
	reconcileOK(t, r) // t0: allocated, no condition yet
	clk.advance(30*time.Second + 100*time.Millisecond)
	setUse(t, api, "trainer", "whole-1", metav1.ConditionFalse, at(29*time.Second))
	reconcileOK(t, r) // t0+30.1
	clk.advance(500 * time.Millisecond)
	setUse(t, api, "notebook", "whole-0", metav1.ConditionTrue, at(time.Second))
	reconcileOK(t, r) // t0+30.6: the same second
	if got := idleCounter(r, "whole"); got != "29" {
		t.Errorf("idle counter after the notebook's Idle=True: %s, want 29 (idle since t0+1)", got)
	}
	clk.advance(30 * time.Second)
	deallocate(t, api, "notebook")
	deallocate(t, api, "trainer")
	reconcileOK(t, r) // t0+60.6
	closed := closedIn(usageIn(t, api, usageName()))
	// unknown [0, 1), idle [1, 60).
	wantUse(t, "the evicted notebook", closed["notebook/node-a/whole-0"], "0", "59", "1")
	// unknown [0, 29), in use [29, 60).
	wantUse(t, "the trainer", closed["trainer/node-a/whole-1"], "31", "0", "29")
}
