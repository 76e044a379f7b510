package idle

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller/internal/testworld"
)

// The world of these tests: tenant team-a over namespace a, with an idle
// policy of 5% for 10 minutes and a 5-minute warning; claim a/notebook of
// one h100 on node-a, reserved for pod a/notebook, idle since t0 as the
// node's plugin reports it, with a use Lease renewed now and acquired an
// hour before t0.
const (
	leaseNamespace = "gpuaas"
	node           = "node-a"
	podUID         = types.UID("notebook-uid")
)

var t0 = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

type world struct {
	objs    []client.Object
	now     time.Time
	kueue   bool
	evictFn func() error // what the Eviction API answers; nil: it evicts
	// podReadFails: how many reads of a pod fail before they succeed.
	podReadFails int
}

func newWorld(t *testing.T, action gpuaas.IdleAction) *world {
	t.Helper()
	q := testworld.TeamQuota("team-a", "a", "8")
	q.Spec.IdlePolicy = &gpuaas.IdlePolicy{ThresholdPercent: 5, Duration: metav1.Duration{Duration: 10 * time.Minute},
		Warning: &metav1.Duration{Duration: 5 * time.Minute}, Action: action}
	q.Status.Namespaces = []string{"a"}
	objs := append(testworld.World(t), q, testworld.Namespace("a", map[string]string{"team": "a"}),
		idleClaim(t0, "gpu-0"), pod("notebook", podUID, nil), lease(node, t0.Add(-time.Hour), t0.Add(time.Hour)))
	return &world{objs: objs, now: t0}
}

func idleClaim(since time.Time, devices ...string) *resourceapi.ResourceClaim {
	c := testworld.AllocatedTo(testworld.Claim("a", "notebook", "h100", int64(len(devices))), node, devices...)
	for _, d := range devices {
		c.Status.Devices = append(c.Status.Devices, resourceapi.AllocatedDeviceStatus{
			Driver: testworld.Driver, Pool: node, Device: d,
			Conditions: []metav1.Condition{deviceIdle(metav1.ConditionTrue, gpuaas.ReasonIdleBelowThreshold, since)},
		})
	}
	c.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "notebook", UID: podUID}}
	return c
}

func deviceIdle(status metav1.ConditionStatus, reason string, since time.Time) metav1.Condition {
	return metav1.Condition{Type: gpuaas.DeviceConditionIdle, Status: status, Reason: reason,
		Message: "SM 0% (threshold 5%)", LastTransitionTime: metav1.NewTime(since)}
}

func pod(name string, uid types.UID, owner *metav1.OwnerReference) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: name, UID: uid}}
	if owner != nil {
		p.OwnerReferences = []metav1.OwnerReference{*owner}
	}
	return p
}

// lease is the plugin's use Lease of node, acquired at start and valid
// (renewed, 30 s) until expiry.
func lease(node string, start, expiry time.Time) *coordinationv1.Lease {
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: leaseNamespace, Name: gpuaas.UseLeasePrefix + node},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("plugin-" + node), LeaseDurationSeconds: ptr.To[int32](30),
			AcquireTime: &metav1.MicroTime{Time: start}, RenewTime: &metav1.MicroTime{Time: expiry.Add(-30 * time.Second)}},
	}
}

// replace swaps the world's object of obj's kind and name for obj.
func (w *world) replace(obj client.Object) {
	w.objs = slices.DeleteFunc(w.objs, func(o client.Object) bool {
		return fmt.Sprintf("%T", o) == fmt.Sprintf("%T", obj) && o.GetName() == obj.GetName() && o.GetNamespace() == obj.GetNamespace()
	})
	w.objs = append(w.objs, obj)
}

func (w *world) remove(obj client.Object) {
	w.objs = slices.DeleteFunc(w.objs, func(o client.Object) bool {
		return fmt.Sprintf("%T", o) == fmt.Sprintf("%T", obj) && o.GetName() == obj.GetName() && o.GetNamespace() == obj.GetNamespace()
	})
}

// recorder keeps the events as "Kind/name Reason note".
type recorder struct{ events []string }

func (r *recorder) Eventf(regarding, _ runtime.Object, _, reason, _, note string, args ...any) {
	m, _ := meta.Accessor(regarding)
	kind := strings.TrimPrefix(fmt.Sprintf("%T", regarding), "*v1.")
	r.events = append(r.events, fmt.Sprintf("%s/%s %s %s", kind, m.GetName(), reason, fmt.Sprintf(note, args...)))
}

func (r *recorder) reasons() []string {
	var out []string
	for _, e := range r.events {
		f := strings.Fields(e)
		out = append(out, f[0]+" "+f[1])
	}
	return out
}

type run struct {
	t      *testing.T
	w      *world
	r      *Reconciler
	c      client.Client
	events *recorder
}

func (w *world) start(t *testing.T) *run {
	t.Helper()
	base := testworld.NewFakeClient(t, w.objs...)
	c := base
	if w.evictFn != nil || w.podReadFails > 0 {
		c = interceptorClient(base, w)
	}
	rec := &recorder{}
	r := &Reconciler{Client: c, Live: c, Events: rec, LeaseNamespace: leaseNamespace, Kueue: w.kueue,
		Now: func() time.Time { return w.now }}
	return &run{t: t, w: w, r: r, c: c, events: rec}
}

func interceptorClient(base client.WithWatch, w *world) client.WithWatch {
	return interceptor.NewClient(base, interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if _, ok := obj.(*corev1.Pod); ok && w.podReadFails > 0 {
				w.podReadFails--
				return apierrors.NewServiceUnavailable("the API server is restarting")
			}
			return c.Get(ctx, key, obj, opts...)
		},
		SubResourceCreate: func(ctx context.Context, c client.Client, sub string, obj, subObj client.Object, opts ...client.SubResourceCreateOption) error {
			if sub == "eviction" && w.evictFn != nil {
				if err := w.evictFn(); err != nil {
					return err
				}
			}
			return c.SubResource(sub).Create(ctx, obj, subObj, opts...)
		},
	})
}

// at reconciles the claim at time now.
func (x *run) at(now time.Time) reconcile.Result {
	x.t.Helper()
	x.w.now = now
	res, err := x.r.Reconcile(x.t.Context(), reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "a", Name: "notebook"}})
	if err != nil {
		x.t.Fatalf("Reconcile at %s: %v", now.Sub(t0), err)
	}
	return res
}

func (x *run) podExists(name string) bool {
	x.t.Helper()
	err := x.c.Get(x.t.Context(), types.NamespacedName{Namespace: "a", Name: name}, &corev1.Pod{})
	if err != nil && !apierrors.IsNotFound(err) {
		x.t.Fatal(err)
	}
	return err == nil
}

// neverActs reconciles the claim long past duration and warning and
// checks that nothing was warned or done.
func (x *run) neverActs() {
	x.t.Helper()
	for _, after := range []time.Duration{10 * time.Minute, 15 * time.Minute, 2 * time.Hour} {
		x.at(t0.Add(after))
	}
	if len(x.events.events) > 0 || !x.podExists("notebook") {
		x.t.Errorf("acted on a claim it must not act on: events %q, pod exists %v", x.events.events, x.podExists("notebook"))
	}
}

func TestEvictsAfterDurationAndWarning(t *testing.T) {
	x := newWorld(t, gpuaas.IdleActionEvict).start(t)
	if res := x.at(t0.Add(4 * time.Minute)); res.RequeueAfter != 6*time.Minute || len(x.events.events) > 0 {
		t.Fatalf("idle 4m of a 10m policy: requeue %v (want 6m), events %q (want none)", res.RequeueAfter, x.events.events)
	}
	if res := x.at(t0.Add(10 * time.Minute)); res.RequeueAfter != 5*time.Minute {
		t.Fatalf("warned: requeue %v, want the 5m warning", res.RequeueAfter)
	}
	want := []string{"ResourceClaim/notebook IdleWarning", "Pod/notebook IdleWarning"}
	if got := x.events.reasons(); !slices.Equal(got, want) || !x.podExists("notebook") {
		t.Fatalf("after the duration: events %q, want %q and the pod kept", x.events.events, want)
	}
	for _, s := range []string{"idle since 2026-12-01T12:00:00Z below 5% for 10m0s (policy tenantquota/team-a)", "SM 0% (threshold 5%)", "its pods are evicted at 2026-12-01T12:15:00Z"} {
		if !strings.Contains(x.events.events[0], s) {
			t.Errorf("warning %q does not say %q", x.events.events[0], s)
		}
	}
	if c := x.quotaCondition(); c == nil || c.Status != metav1.ConditionTrue || !strings.Contains(c.Message, "1 claim(s)") {
		t.Errorf("TenantQuota condition IdleClaims = %+v, want True counting 1 claim", c)
	}
	if n := testutil.ToFloat64(idleClaims.WithLabelValues("team-a", "Evict")); n != 1 {
		t.Errorf("gpuaas_idle_claims{team-a,Evict} = %v, want 1", n)
	}
	before := testutil.ToFloat64(idleActions.WithLabelValues("team-a", "Evict", resultDone))

	x.at(t0.Add(15 * time.Minute))
	if x.podExists("notebook") {
		t.Fatal("the pod was not evicted after duration and warning")
	}
	if got := x.events.reasons()[2:]; !slices.Equal(got, []string{"Pod/notebook IdleEvicted", "ResourceClaim/notebook IdleEvicted"}) {
		t.Errorf("action events %q", x.events.events[2:])
	}
	if n := testutil.ToFloat64(idleActions.WithLabelValues("team-a", "Evict", resultDone)) - before; n != 1 {
		t.Errorf("gpuaas_idle_actions_total{team-a,Evict,done} rose by %v, want 1", n)
	}
	n := len(x.events.events)
	x.at(t0.Add(20 * time.Minute))
	if len(x.events.events) != n {
		t.Errorf("acted twice: %q", x.events.events[n:])
	}
}

func (x *run) quotaCondition() *metav1.Condition {
	x.t.Helper()
	var q gpuaas.TenantQuota
	if err := x.c.Get(x.t.Context(), types.NamespacedName{Name: "team-a"}, &q); err != nil {
		x.t.Fatal(err)
	}
	return meta.FindStatusCondition(q.Status.Conditions, gpuaas.ConditionIdleClaims)
}

func TestWarningNotLostToAFailedRead(t *testing.T) {
	w := newWorld(t, gpuaas.IdleActionEvict)
	w.podReadFails = 1
	x := w.start(t)
	w.now = t0.Add(10 * time.Minute)
	if _, err := x.r.Reconcile(t.Context(), reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "a", Name: "notebook"}}); err == nil {
		t.Fatal("the pod's read failed and the reconcile did not")
	}
	x.at(t0.Add(10 * time.Minute)) // the retry
	want := []string{"ResourceClaim/notebook IdleWarning", "Pod/notebook IdleWarning"}
	if got := x.events.reasons(); !slices.Equal(got, want) {
		t.Errorf("after a failed read and its retry: events %q, want the warning %q", x.events.events, want)
	}
}

func TestNotifyOnlyNotifies(t *testing.T) {
	w := newWorld(t, gpuaas.IdleActionNotify)
	x := w.start(t)
	x.at(t0.Add(10 * time.Minute))
	x.at(t0.Add(15 * time.Minute))
	want := []string{"ResourceClaim/notebook IdleWarning", "Pod/notebook IdleWarning", "ResourceClaim/notebook IdleNotified", "Pod/notebook IdleNotified"}
	if got := x.events.reasons(); !slices.Equal(got, want) || !x.podExists("notebook") {
		t.Errorf("Notify: events %q, want %q and the pod kept", x.events.events, want)
	}
}

func TestUsedAgainDropsTheWarning(t *testing.T) {
	w := newWorld(t, gpuaas.IdleActionEvict)
	x := w.start(t)
	x.at(t0.Add(10 * time.Minute))
	claim := idleClaim(t0, "gpu-0")
	claim.Status.Devices[0].Conditions[0] = deviceIdle(metav1.ConditionFalse, gpuaas.ReasonIdleInUse, t0.Add(12*time.Minute))
	x.updateClaimStatus(claim)
	x.at(t0.Add(15 * time.Minute))
	if !x.podExists("notebook") {
		t.Error("evicted a claim used again during the warning")
	}
	if c := x.quotaCondition(); c == nil || c.Status != metav1.ConditionFalse {
		t.Errorf("IdleClaims after the claim was used again = %+v, want False", c)
	}
}

func (x *run) updateClaimStatus(want *resourceapi.ResourceClaim) {
	x.t.Helper()
	var have resourceapi.ResourceClaim
	if err := x.c.Get(x.t.Context(), client.ObjectKeyFromObject(want), &have); err != nil {
		x.t.Fatal(err)
	}
	have.Status = want.Status
	// The test world's fake client has no status subresource for claims:
	// an update writes the status.
	if err := x.c.Update(x.t.Context(), &have); err != nil {
		x.t.Fatal(err)
	}
}

func TestNeverActsOnUnknownUse(t *testing.T) {
	for _, tc := range []struct {
		name string
		cond *metav1.Condition
	}{
		{"unknown", ptr.To(deviceIdle(metav1.ConditionUnknown, gpuaas.ReasonIdleUseUnknown, t0))},
		{"no samples", ptr.To(deviceIdle(metav1.ConditionUnknown, gpuaas.ReasonIdleNoSamples, t0))},
		{"no condition", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, gpuaas.IdleActionEvict)
			// Two GPUs: one idle, the other's use unknown.
			claim := idleClaim(t0, "gpu-0", "gpu-1")
			claim.Status.Devices[1].Conditions = nil
			if tc.cond != nil {
				claim.Status.Devices[1].Conditions = []metav1.Condition{*tc.cond}
			}
			w.replace(claim)
			w.start(t).neverActs()
		})
	}
}

func TestNeverActsOnAClaimBeingDeleted(t *testing.T) {
	w := newWorld(t, gpuaas.IdleActionEvict)
	claim := idleClaim(t0, "gpu-0")
	claim.Finalizers = []string{"example.com/hold"}
	claim.DeletionTimestamp = ptr.To(metav1.NewTime(t0))
	w.replace(claim)
	w.start(t).neverActs()
}

// An admin-access claim (a monitoring agent's) holds no GPU from anyone:
// acting on it would free nothing.
func TestNeverActsOnAdminAccess(t *testing.T) {
	w := newWorld(t, gpuaas.IdleActionEvict)
	claim := idleClaim(t0, "gpu-0")
	claim.Status.Allocation.Devices.Results[0].AdminAccess = ptr.To(true)
	w.replace(claim)
	w.start(t).neverActs()
}

func TestEvictWithoutAPodToEvictSaysSo(t *testing.T) {
	w := newWorld(t, gpuaas.IdleActionEvict)
	w.remove(pod("notebook", podUID, nil))
	// A pod of the reserved name, made since: another pod, not the claim's.
	w.objs = append(w.objs, pod("notebook", "another-uid", nil))
	x := w.start(t)
	x.at(t0.Add(10 * time.Minute))
	x.at(t0.Add(15 * time.Minute))
	last := x.events.events[len(x.events.events)-1]
	if !x.podExists("notebook") || !strings.Contains(last, "IdleNotified") || !strings.Contains(last, "no pod") {
		t.Errorf("evicted a pod the claim is not reserved for, or did not say there was none: events %q", x.events.events)
	}
}

func TestNeverActsWithoutCurrentSamples(t *testing.T) {
	for _, tc := range []struct {
		name  string
		lease *coordinationv1.Lease
	}{
		{"lease expired", lease(node, t0.Add(-time.Hour), t0.Add(5*time.Minute))},
		{"plugin restarted after the idleness began", lease(node, t0.Add(time.Minute), t0.Add(3*time.Hour))},
		{"lease of another node", lease("node-b", t0.Add(-time.Hour), t0.Add(3*time.Hour))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, gpuaas.IdleActionEvict)
			w.remove(lease(node, t0, t0))
			w.objs = append(w.objs, tc.lease)
			w.start(t).neverActs()
		})
	}
}

func TestExemptNamespaceIsNeverActedOn(t *testing.T) {
	w := newWorld(t, gpuaas.IdleActionEvict)
	w.replace(testworld.Namespace("a", map[string]string{"team": "a", "gpuaas.io/idle-exempt": "true"}))
	var q *gpuaas.TenantQuota
	for _, o := range w.objs {
		if tq, ok := o.(*gpuaas.TenantQuota); ok {
			q = tq
		}
	}
	q.Spec.IdlePolicy.ExemptNamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"gpuaas.io/idle-exempt": "true"}}
	w.start(t).neverActs()
}

func TestTenantLabelsOnClaimOrPodDoNotExempt(t *testing.T) {
	w := newWorld(t, gpuaas.IdleActionEvict)
	exempt := map[string]string{"gpuaas.io/idle-exempt": "true"}
	for _, o := range w.objs {
		switch o := o.(type) {
		case *gpuaas.TenantQuota:
			o.Spec.IdlePolicy.ExemptNamespaceSelector = &metav1.LabelSelector{MatchLabels: exempt}
		case *resourceapi.ResourceClaim, *corev1.Pod:
			o.SetLabels(exempt)
			o.SetAnnotations(exempt)
		}
	}
	x := w.start(t)
	x.at(t0.Add(10 * time.Minute))
	x.at(t0.Add(15 * time.Minute))
	if x.podExists("notebook") {
		t.Errorf("a label the tenant wrote on its claim and pod exempted them: events %q", x.events.events)
	}
}

func TestProfileWithActionNoneExempts(t *testing.T) {
	w := newWorld(t, gpuaas.IdleActionEvict)
	for _, o := range w.objs {
		if p, ok := o.(*gpuaas.GpuProfile); ok && p.Name == "h100" {
			p.Spec.IdlePolicy = &gpuaas.IdlePolicy{Duration: metav1.Duration{Duration: time.Minute}, Action: gpuaas.IdleActionNone}
		}
	}
	w.start(t).neverActs()
}

func TestProfilePolicyOverridesTheTenants(t *testing.T) {
	w := newWorld(t, gpuaas.IdleActionEvict)
	for _, o := range w.objs {
		if p, ok := o.(*gpuaas.GpuProfile); ok && p.Name == "h100" {
			p.Spec.IdlePolicy = &gpuaas.IdlePolicy{Duration: metav1.Duration{Duration: time.Hour}, Action: gpuaas.IdleActionNotify}
		}
	}
	x := w.start(t)
	if res := x.at(t0.Add(15 * time.Minute)); res.RequeueAfter != 45*time.Minute || len(x.events.events) > 0 {
		t.Fatalf("the profile's 1h policy: requeue %v (want 45m), events %q", res.RequeueAfter, x.events.events)
	}
	x.at(t0.Add(time.Hour))
	if !x.podExists("notebook") || !strings.Contains(x.events.events[0], "policy gpuprofile/h100") {
		t.Errorf("events %q: want the profile's Notify", x.events.events)
	}
}

func TestEvictionRefusedByBudgetIsRetriedNeverForced(t *testing.T) {
	w := newWorld(t, gpuaas.IdleActionEvict)
	refuse := true
	w.evictFn = func() error {
		if refuse {
			return apierrors.NewTooManyRequests("Cannot evict pod as it would violate the pod's disruption budget.", 0)
		}
		return nil
	}
	x := w.start(t)
	x.at(t0.Add(10 * time.Minute))
	before := testutil.ToFloat64(idleActions.WithLabelValues("team-a", "Evict", resultRefused))
	res := x.at(t0.Add(15 * time.Minute))
	if !x.podExists("notebook") || res.RequeueAfter != retryAfter {
		t.Fatalf("refused eviction: pod kept %v (want true), requeue %v (want %v)", x.podExists("notebook"), res.RequeueAfter, retryAfter)
	}
	if got := x.events.reasons(); !slices.Contains(got, "Pod/notebook IdleEvictionRefused") {
		t.Errorf("refusal not reported: %q", x.events.events)
	}
	if n := testutil.ToFloat64(idleActions.WithLabelValues("team-a", "Evict", resultRefused)) - before; n != 1 {
		t.Errorf("gpuaas_idle_actions_total{result=refused} rose by %v, want 1", n)
	}
	refuse = false
	x.at(t0.Add(16 * time.Minute))
	if x.podExists("notebook") {
		t.Error("not evicted once the budget allowed it")
	}
}

// workload is a Kueue Workload of namespace a controlled by owner.
func workload(name string, owner metav1.OwnerReference) *unstructured.Unstructured {
	wl := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
		"metadata": map[string]any{"namespace": "a", "name": name, "uid": "wl-" + name},
		"spec":     map[string]any{"active": true, "queueName": "team-a"},
	}}
	wl.SetOwnerReferences([]metav1.OwnerReference{owner})
	return wl
}

func TestDeactivatePatchesTheWorkloadOfThePodsJob(t *testing.T) {
	w := newWorld(t, gpuaas.IdleActionDeactivate)
	w.kueue = true
	job := testworld.ControllerRef("batch/v1", "Job", "trainer-job", "job-uid")
	w.replace(pod("notebook", podUID, &job))
	w.objs = append(w.objs,
		&metav1.PartialObjectMetadata{TypeMeta: metav1.TypeMeta{APIVersion: "batch/v1", Kind: "Job"},
			ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "trainer-job", UID: "job-uid"}},
		// A look-alike names the Job by name, with another UID.
		workload("imposter-trainer-job", testworld.ControllerRef("batch/v1", "Job", "trainer-job", "other-uid")),
		workload("job-trainer-job", job))
	x := w.start(t)
	x.at(t0.Add(10 * time.Minute))
	x.at(t0.Add(15 * time.Minute))
	if active := x.workloadActive("job-trainer-job"); active {
		t.Errorf("the Job's Workload is still active: events %q", x.events.events)
	}
	if !x.workloadActive("imposter-trainer-job") {
		t.Error("deactivated a look-alike Workload whose ownerReference names another UID")
	}
	if !x.podExists("notebook") || !slices.Contains(x.events.reasons(), "Pod/notebook IdleDeactivated") {
		t.Errorf("Deactivate: pod kept %v (want true, Kueue evicts it), events %q", x.podExists("notebook"), x.events.events)
	}
}

func TestDeactivateWithoutWorkloadNotifies(t *testing.T) {
	w := newWorld(t, gpuaas.IdleActionDeactivate)
	w.kueue = true
	x := w.start(t)
	x.at(t0.Add(10 * time.Minute))
	x.at(t0.Add(15 * time.Minute))
	last := x.events.events[len(x.events.events)-1]
	if !strings.Contains(last, "IdleNotified") || !strings.Contains(last, "no Kueue Workload") || !x.podExists("notebook") {
		t.Errorf("Deactivate without a Workload: events %q, want a notification saying so", x.events.events)
	}
}

func (x *run) workloadActive(name string) bool {
	x.t.Helper()
	wl := &unstructured.Unstructured{}
	wl.SetAPIVersion("kueue.x-k8s.io/v1beta2")
	wl.SetKind("Workload")
	if err := x.c.Get(x.t.Context(), types.NamespacedName{Namespace: "a", Name: name}, wl); err != nil {
		x.t.Fatal(err)
	}
	active, _, _ := unstructured.NestedBool(wl.Object, "spec", "active")
	return active
}
