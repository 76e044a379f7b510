package admission

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
)

// reclaimWorld: cohort "research" of team-a (namespace a, 1 unit, may
// borrow) and team-b (namespace b, 2 units). team-a holds its own GPU,
// allocated, and borrows team-b's two with claims the
// kube-controller-manager made for pods that never get scheduled (see
// podFor), idle-1 created age ago, idle-2 (the newest) newest ago; team-b
// holds nothing and is locked out of its own quota.
func reclaimWorld(t *testing.T, age, newest time.Duration) []client.Object {
	objs := standaloneReclaimWorld(t, age, newest, false)
	for _, o := range objs {
		if c, ok := o.(*resourceapi.ResourceClaim); ok && c.Status.Allocation == nil {
			objs = append(objs, podFor(c))
		}
	}
	return objs
}

// standaloneReclaimWorld is reclaimWorld with idle claims created by hand:
// no pod's template made them. optIn sets team-a's
// reclaimStandaloneClaims.
func standaloneReclaimWorld(t *testing.T, age, newest time.Duration, optIn bool) []client.Object {
	created := metav1.NewTime(time.Now().Add(-age))
	own := allocatedTo(claim("a", "own", "h100", 1), "node-a", "gpu-0")
	idle1, idle2 := claim("a", "idle-1", "h100", 1), claim("a", "idle-2", "h100", 1)
	own.CreationTimestamp, idle1.CreationTimestamp = created, created
	idle2.CreationTimestamp = metav1.NewTime(time.Now().Add(-newest))
	if age == newest { // same second: the later create is told by its resourceVersion
		idle2.CreationTimestamp = created
	}
	return append(world(t), ns("a", nil), ns("b", nil),
		tenantQuota("team-a", 0, gpuaas.TenantQuotaSpec{Namespaces: []string{"a"}, Cohort: "research",
			Limits: gpuaas.QuotaLimits{GpuUnits: qty("1")}, ReclaimStandaloneClaims: optIn}),
		tenantQuota("team-b", 1, gpuaas.TenantQuotaSpec{Namespaces: []string{"b"}, Cohort: "research",
			Limits: gpuaas.QuotaLimits{GpuUnits: qty("2")}}),
		own, idle1, idle2)
}

// podFor makes c the claim the kube-controller-manager generated for a
// pod's template claim "gpu": the annotation and controller reference on
// the claim, and the pod's status naming it. It returns the pod.
func podFor(c *resourceapi.ResourceClaim) *corev1.Pod {
	pod := gpuPod("pod-"+c.Name, types.UID("pod-uid-"+c.Name), nil, false)
	pod.Status.ResourceClaimStatuses = []corev1.PodResourceClaimStatus{{Name: "gpu", ResourceClaimName: ptr.To(c.Name)}}
	c.OwnerReferences = []metav1.OwnerReference{controllerRef("v1", "Pod", pod.Name, pod.UID)}
	c.Annotations = map[string]string{resourceapi.PodResourceClaimAnnotation: "gpu"}
	return pod
}

// Issue 26 item 6: four bare claims of a borrower locked a lender out of
// its own quota for as long as they existed. Now a lender refused within
// its own limit gets back what borrowers hold with claims unallocated for
// longer than ReclaimAfter: the newest such claims are deleted, just
// enough, and the quota is kept for the lender against the borrower's next
// claim.
func TestLenderReclaimsFromUnallocatedBorrowers(t *testing.T) {
	acct, c := newAccountant(t, reclaimWorld(t, 20*time.Minute, 20*time.Minute)...)
	acct.ReclaimAfter = 10 * time.Minute
	reclaimedBefore := testutil.ToFloat64(reclaimedClaims.WithLabelValues("team-a"))

	adm, err := acct.Admit(ctx(t), claim("b", "lender-1", "h100", 1), false)
	if err != nil {
		t.Fatal(err)
	}
	if adm.Allowed || !strings.Contains(adm.Reason, "has lent it out") || !strings.Contains(adm.Reason, "Reclaiming it: deleting 1 of the borrowers' claims") ||
		!strings.Contains(adm.Reason, "a/idle-2") {
		t.Fatalf("lender's first claim: allowed %v, %q; want a refusal that reclaims a/idle-2", adm.Allowed, adm.Reason)
	}
	waitGone(t, c, "a", "idle-2")
	// One claim covers what the lender lacks: the others stay.
	if !exists(t, c, "a", "idle-1") || !exists(t, c, "a", "own") {
		t.Fatal("a/own or a/idle-1 is gone too; only the newest unallocated claim should be")
	}

	// The borrower's pod gets its claim made again at once: the quota is
	// kept for the lender.
	adm, _ = acct.Admit(ctx(t), claim("a", "idle-2-again", "h100", 1), false)
	if adm.Allowed {
		t.Fatal("the borrower's re-made claim took the quota reclaimed for the lender")
	}
	adm, _ = acct.Admit(ctx(t), claim("b", "lender-2", "h100", 1), false)
	if !adm.Allowed {
		t.Fatalf("lender's retry refused after the reclaim: %s", adm.Reason)
	}
	if got := testutil.ToFloat64(reclaimedClaims.WithLabelValues("team-a")) - reclaimedBefore; got != 1 {
		t.Errorf("gpuaas_quota_reclaimed_claims_total{tenant=team-a} grew by %v, want 1", got)
	}
}

// What is never taken: claims younger than ReclaimAfter, allocated claims,
// and anything at all when reclaiming is off (the old rule: lenders wait)
// or when what could be taken does not cover what the lender lacks.
func TestReclaimTakesOnlyStaleUnallocatedBorrowing(t *testing.T) {
	tests := []struct {
		name        string
		age, newest time.Duration
		after       time.Duration
		want        int64 // GPUs the lender asks for
		why         string
	}{
		{name: "reclaiming off: the lender waits", age: time.Hour, newest: time.Hour, after: 0, want: 1, why: "admitted once the borrowers give quota back"},
		{name: "claims younger than the grace are kept", age: time.Minute, newest: time.Minute, after: 10 * time.Minute, want: 1, why: "do not cover it: it waits"},
		{name: "not enough to take: nothing is taken", age: time.Hour, newest: time.Minute, after: 10 * time.Minute, want: 2, why: "do not cover it: it waits"},
		{name: "over the lender's own limit: nothing is owed", age: time.Hour, newest: time.Hour, after: 10 * time.Minute, want: 3, why: "limit 2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			acct, c := newAccountant(t, reclaimWorld(t, tt.age, tt.newest)...)
			acct.ReclaimAfter = tt.after
			adm, err := acct.Admit(ctx(t), claim("b", "lender", "h100", tt.want), false)
			if err != nil {
				t.Fatal(err)
			}
			if adm.Allowed || !strings.Contains(adm.Reason, tt.why) || strings.Contains(adm.Reason, "Reclaiming") {
				t.Fatalf("allowed %v, %q; want a refusal containing %q that reclaims nothing", adm.Allowed, adm.Reason, tt.why)
			}
			var claims resourceapi.ResourceClaimList
			if err := c.List(ctx(t), &claims, client.InNamespace("a")); err != nil {
				t.Fatal(err)
			}
			if len(claims.Items) != 3 {
				t.Fatalf("the borrower has %d claims left, want all 3", len(claims.Items))
			}
		})
	}
}

// A claim the scheduler allocates between the decision and the delete is
// kept: the delete is preconditioned on what was judged.
func TestReclaimKeepsAClaimAllocatedMeanwhile(t *testing.T) {
	acct, c := newAccountant(t, reclaimWorld(t, time.Hour, time.Hour-time.Second)...)
	acct.ReclaimAfter = time.Minute
	victim := reclaimVictim{tenant: "team-a"}
	var got resourceapi.ResourceClaim
	if err := c.Get(ctx(t), client.ObjectKey{Namespace: "a", Name: "idle-2"}, &got); err != nil {
		t.Fatal(err)
	}
	victim.key, victim.uid, victim.resourceVersion = client.ObjectKeyFromObject(&got), got.UID, got.ResourceVersion
	allocatedTo(&got, "node-a", "gpu-1")
	if err := c.Update(ctx(t), &got); err != nil {
		t.Fatal(err)
	}
	acct.deleteVictim(ctx(t), "team-b", victim)
	if !exists(t, c, "a", "idle-2") {
		t.Fatal("a claim allocated after it was judged was deleted")
	}
}

func exists(t *testing.T, c client.Client, namespace, name string) bool {
	t.Helper()
	return existsCtx(ctx(t), t, c, namespace, name)
}

func existsCtx(ctx context.Context, t *testing.T, c client.Client, namespace, name string) bool {
	t.Helper()
	err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &resourceapi.ResourceClaim{})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	return err == nil
}

// waitGone waits for the reclaimer, which deletes in the background.
func waitGone(t *testing.T, c client.Client, namespace, name string) {
	t.Helper()
	err := wait.PollUntilContextTimeout(ctx(t), 10*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		return !existsCtx(ctx, t, c, namespace, name), nil
	})
	if err != nil {
		t.Fatalf("claim %s/%s was not deleted: %v", namespace, name, err)
	}
}

// Issue 55 route 2: a borrower that puts a finalizer of its own on its idle
// claims turned reclaim into a no-op: deleted, they only got a
// deletionTimestamp and were charged still, and the lender was refused on
// every retry while the metric counted them reclaimed. An unallocated
// claim being deleted costs nothing (the scheduler never allocates it),
// and the metric counts only claims really gone.
func TestReclaimIsNotDefeatedByABorrowersFinalizer(t *testing.T) {
	objs := reclaimWorld(t, 20*time.Minute, 20*time.Minute)
	for _, o := range objs {
		if c, ok := o.(*resourceapi.ResourceClaim); ok && c.Status.Allocation == nil {
			c.Finalizers = []string{"borrower.example.com/hold"}
		}
	}
	acct, c := newAccountant(t, objs...)
	acct.ReclaimAfter = 10 * time.Minute
	reclaimedBefore := testutil.ToFloat64(reclaimedClaims.WithLabelValues("team-a"))

	adm, err := acct.Admit(ctx(t), claim("b", "lender-1", "h100", 1), false)
	if err != nil {
		t.Fatal(err)
	}
	if adm.Allowed || !strings.Contains(adm.Reason, "Reclaiming it") {
		t.Fatalf("lender's first claim: allowed %v, %q; want a refusal that reclaims", adm.Allowed, adm.Reason)
	}
	err = wait.PollUntilContextTimeout(ctx(t), 10*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		var got resourceapi.ResourceClaim
		if err := c.Get(ctx, client.ObjectKey{Namespace: "a", Name: "idle-2"}, &got); err != nil {
			return false, err
		}
		return got.DeletionTimestamp != nil, nil
	})
	if err != nil {
		t.Fatalf("a/idle-2 was not deleted: %v", err)
	}
	adm, err = acct.Admit(ctx(t), claim("b", "lender-2", "h100", 1), false)
	if err != nil {
		t.Fatal(err)
	}
	if !adm.Allowed {
		t.Errorf("lender's retry refused while the reclaimed claim waits on its borrower's finalizer: %s", adm.Reason)
	}
	if got := testutil.ToFloat64(reclaimedClaims.WithLabelValues("team-a")) - reclaimedBefore; got != 0 {
		t.Errorf("gpuaas_quota_reclaimed_claims_total{tenant=team-a} grew by %v for a claim its finalizer keeps, want 0", got)
	}
}

// Issue 55 route 3: the delete was preconditioned on the resourceVersion
// judged, and a conflict taken for "allocated or deleted meanwhile", so a
// borrower relabelling its idle claims in a loop made every delete
// conflict. A conflict now re-reads the claim and deletes it again while
// it is still unallocated with the same UID.
func TestReclaimDeletesAClaimRelabelledMeanwhile(t *testing.T) {
	acct, c := newAccountant(t, reclaimWorld(t, time.Hour, time.Hour-time.Second)...)
	acct.ReclaimAfter = time.Minute
	var got resourceapi.ResourceClaim
	if err := c.Get(ctx(t), client.ObjectKey{Namespace: "a", Name: "idle-2"}, &got); err != nil {
		t.Fatal(err)
	}
	victim := reclaimVictim{tenant: "team-a", key: client.ObjectKeyFromObject(&got), uid: got.UID, resourceVersion: got.ResourceVersion}
	got.Labels = map[string]string{"relabelled": "1"}
	if err := c.Update(ctx(t), &got); err != nil {
		t.Fatal(err)
	}
	acct.deleteVictim(ctx(t), "team-b", victim)
	if exists(t, c, "a", "idle-2") {
		t.Fatal("a claim relabelled after it was judged, still unallocated, was kept")
	}
}

// Issue 55 route 7: reclaim deleted standalone claims for good (a claim a
// team made by hand for a Job waiting behind a gang: nothing makes it
// again), and the event said a pod's claim is made again. Only claims the
// kube-controller-manager made from a pod's template are taken, by what
// the API server vouches for (the pod's status names the claim), not by
// the claim's own annotation and ownerReference, which its author writes;
// a TenantQuota opts its standalone claims in, and their event says
// nothing makes them again.
func TestReclaimTakesOnlyClaimsATemplateMade(t *testing.T) {
	lenderAsks := func(t *testing.T, objs []client.Object) (Admission, client.Client, *events.FakeRecorder) {
		t.Helper()
		acct, c := newAccountant(t, objs...)
		acct.ReclaimAfter = 10 * time.Minute
		rec := events.NewFakeRecorder(10)
		acct.ReclaimEvents = rec
		adm, err := acct.Admit(ctx(t), claim("b", "lender", "h100", 1), false)
		if err != nil {
			t.Fatal(err)
		}
		return adm, c, rec
	}
	t.Run("standalone claims are kept", func(t *testing.T) {
		adm, c, _ := lenderAsks(t, standaloneReclaimWorld(t, time.Hour, time.Hour, false))
		if adm.Allowed || strings.Contains(adm.Reason, "Reclaiming") || !strings.Contains(adm.Reason, "do not cover it: it waits") {
			t.Fatalf("allowed %v, %q; want a refusal that reclaims nothing", adm.Allowed, adm.Reason)
		}
		if !exists(t, c, "a", "idle-1") || !exists(t, c, "a", "idle-2") {
			t.Fatal("a claim created by hand was deleted")
		}
	})
	t.Run("a claim that only says a template made it is kept", func(t *testing.T) {
		objs := standaloneReclaimWorld(t, time.Hour, time.Hour, false)
		for _, o := range objs {
			if cl, ok := o.(*resourceapi.ResourceClaim); ok && cl.Status.Allocation == nil {
				// The claim names a real pod of the tenant as its
				// controller, with the annotation; the pod's status
				// names the claim the kube-controller-manager made.
				pod := podFor(cl)
				pod.Status.ResourceClaimStatuses[0].ResourceClaimName = ptr.To(cl.Name + "-generated")
				objs = append(objs, pod)
			}
		}
		adm, c, _ := lenderAsks(t, objs)
		if adm.Allowed || strings.Contains(adm.Reason, "Reclaiming") {
			t.Fatalf("allowed %v, %q; want a refusal that reclaims nothing", adm.Allowed, adm.Reason)
		}
		if !exists(t, c, "a", "idle-1") || !exists(t, c, "a", "idle-2") {
			t.Fatal("a claim that forged its template's annotation and ownerReference was deleted")
		}
	})
	t.Run("a template's claim is taken, and its event says it is made again", func(t *testing.T) {
		adm, c, rec := lenderAsks(t, reclaimWorld(t, time.Hour, time.Hour))
		if adm.Allowed || !strings.Contains(adm.Reason, "Reclaiming it") {
			t.Fatalf("allowed %v, %q; want a refusal that reclaims", adm.Allowed, adm.Reason)
		}
		waitGone(t, c, "a", "idle-2")
		if ev := <-rec.Events; !strings.Contains(ev, "the kube-controller-manager makes the pod's claim again") {
			t.Errorf("event %q does not say the pod's claim is made again", ev)
		}
	})
	t.Run("opted in, a standalone claim is taken, and its event says nothing makes it again", func(t *testing.T) {
		adm, c, rec := lenderAsks(t, standaloneReclaimWorld(t, time.Hour, time.Hour, true))
		if adm.Allowed || !strings.Contains(adm.Reason, "Reclaiming it") {
			t.Fatalf("allowed %v, %q; want a refusal that reclaims", adm.Allowed, adm.Reason)
		}
		waitGone(t, c, "a", "idle-2")
		if ev := <-rec.Events; !strings.Contains(ev, "nothing makes it again") {
			t.Errorf("event %q does not say that nothing makes the claim again", ev)
		}
	})
}
