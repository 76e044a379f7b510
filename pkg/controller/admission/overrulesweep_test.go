package admission

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Issue 36 route 2: a claim admitted past the quota for a Kueue workload
// whose ownerReference the tenant removed outlived the workload, and the
// tenant used it from a bare pod. The leader's sweep deletes such claims
// once the workload has ended, and only those.
func TestOverruleSweepEndsClaimsOfEndedWorkloads(t *testing.T) {
	ended := kueueWorkloadObj("ended", []types.UID{"job-uid"}, 1000, "Admitted", "Finished")
	running := kueueWorkloadObj("running", []types.UID{"other-job-uid"}, 1000, "Admitted")
	orphan := claim("a", "orphan", "h100", 1) // its ownerReference removed by the tenant
	active := claim("a", "of-running", "h100", 1)
	podRuns := kcmClaim(kueuePod(true), "pod-runs", "h100", 1) // the kube-controller-manager's to delete
	donePod := gpuPod("done", "done-uid", ptr.To(jobRef()), true)
	donePod.Status.Phase = corev1.PodSucceeded
	podDone := kcmClaim(donePod, "pod-done", "h100", 1)
	sameName := claim("a", "same-name", "h100", 1) // made again since: another claim
	acct, c := newAccountant(t, ns("a", nil), ended, running, orphan, active, podRuns, kueuePod(true), donePod, podDone, sameName)
	g := newKueueGate(acct, c)
	records := []overruleRecord{
		{UID: orphan.UID, Name: orphan.Name, Workload: ended.GetUID()},
		{UID: active.UID, Name: active.Name, Workload: running.GetUID()},
		{UID: podRuns.UID, Name: podRuns.Name, Workload: ended.GetUID(), Pod: "pod-uid", PodName: "trainer"},
		{UID: podDone.UID, Name: podDone.Name, Workload: ended.GetUID(), Pod: donePod.UID, PodName: donePod.Name},
		{UID: "old-uid", Name: sameName.Name, Workload: ended.GetUID()},
	}
	if err := g.book.write(ctx(t), "a", nil, records); err != nil {
		t.Fatal(err)
	}
	if err := (&overruleSweeper{gate: g}).sweep(ctx(t)); err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"orphan": false, "of-running": true, "pod-runs": true, "pod-done": false, "same-name": true}
	for name, kept := range want {
		err := c.Get(ctx(t), types.NamespacedName{Namespace: "a", Name: name}, &resourceapi.ResourceClaim{})
		if got := !apierrors.IsNotFound(err); got != kept {
			t.Errorf("claim %s kept = %v, want %v (%v)", name, got, kept, err)
		}
	}
	var books corev1.ConfigMapList
	if err := c.List(ctx(t), &books, client.InNamespace("gpuaas")); err != nil || len(books.Items) != 1 {
		t.Errorf("books %v, %v", books.Items, err)
	}
}

// Issue 55 route 6: the sweep kept an overruled claim while "its pod" ran,
// and found that pod through the claim's controller ownerReference, which
// the tenant edits. Pointed at a never-ending pod of the tenant's own (no
// GPU, no queue), the claim outlived its finished workload. Only the pod
// the Kueue gate verified, recorded in the overrule book by UID when it
// admitted the claim, keeps it.
func TestOverruleSweepKeepsAClaimOnlyForThePodTheGateVerified(t *testing.T) {
	trainer := kueuePod(true)
	forever := gpuPod("forever", "forever-uid", nil, false) // the tenant's, outside Kueue, never ends
	forever.Status.Phase = corev1.PodRunning
	kc := kcmClaim(trainer, "trainer-gpu", "h100", 1)
	wl := workload()
	acct, c := newAccountant(t, append(world(t), ns("a", nil), teamQuota("team-a", "a", "0"), trainer, forever, wl, kc)...)
	g := newKueueGate(acct, c)
	v, err := g.overrule(ctx(t), kc, kcmUser, false)
	if err != nil || v.overrule == nil {
		t.Fatalf("the trainer's claim was not overruled for its workload: %+v, %v", v, err)
	}
	sweep := func() {
		t.Helper()
		if err := (&overruleSweeper{gate: g}).sweep(ctx(t)); err != nil {
			t.Fatal(err)
		}
	}

	// The workload ends while the trainer still runs: kept.
	if err := c.Delete(ctx(t), wl); err != nil {
		t.Fatal(err)
	}
	trainer.Status.Phase = corev1.PodRunning
	if err := c.Status().Update(ctx(t), trainer); err != nil {
		t.Fatal(err)
	}
	sweep()
	if !exists(t, c, "a", kc.Name) {
		t.Fatal("a claim whose verified pod still runs was deleted")
	}

	// The trainer finishes; the tenant points the claim at its own pod.
	trainer.Status.Phase = corev1.PodSucceeded
	if err := c.Status().Update(ctx(t), trainer); err != nil {
		t.Fatal(err)
	}
	var got resourceapi.ResourceClaim
	if err := c.Get(ctx(t), types.NamespacedName{Namespace: "a", Name: kc.Name}, &got); err != nil {
		t.Fatal(err)
	}
	got.OwnerReferences = []metav1.OwnerReference{controllerRef("v1", "Pod", forever.Name, forever.UID)}
	if err := c.Update(ctx(t), &got); err != nil {
		t.Fatal(err)
	}
	sweep()
	if exists(t, c, "a", kc.Name) {
		t.Fatal("the claim outlived its workload and its verified pod by naming another pod that runs")
	}
}
