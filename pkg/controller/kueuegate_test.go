package controller

import (
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// kueuePod is a pod of job "trainer-job" (uid job-uid); admitted pods carry
// Kueue's podset label.
func kueuePod(admittedLabel bool) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "trainer", UID: "pod-uid",
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: "trainer-job", UID: "job-uid", Controller: ptr.To(true)}}}}
	if admittedLabel {
		p.Labels = map[string]string{kueuePodSetLabel: "main"}
	}
	return p
}

func workload(owner types.UID, admitted bool) *unstructured.Unstructured {
	status := "False"
	if admitted {
		status = "True"
	}
	wl := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
		"metadata": map[string]any{"namespace": "a", "name": "job-trainer-job-1"},
		"status":   map[string]any{"conditions": []any{map[string]any{"type": "Admitted", "status": status}}},
	}}
	wl.SetOwnerReferences([]metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: "trainer-job", UID: owner}})
	return wl
}

func TestKueueGateFindsTheAdmittedWorkload(t *testing.T) {
	cases := map[string]struct {
		objs []client.Object
		want string
	}{
		"admitted workload of the pod's job": {[]client.Object{kueuePod(true), workload("job-uid", true)}, "job-trainer-job-1"},
		// A label anyone can set on a bare pod proves nothing by itself.
		"label but no workload":      {[]client.Object{kueuePod(true)}, ""},
		"workload not admitted":      {[]client.Object{kueuePod(true), workload("job-uid", false)}, ""},
		"another job's workload":     {[]client.Object{kueuePod(true), workload("other-uid", true)}, ""},
		"pod Kueue did not start":    {[]client.Object{kueuePod(false), workload("job-uid", true)}, ""},
		"pod gone (claim left over)": {[]client.Object{workload("job-uid", true)}, ""},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			g := &kueueGate{reader: newFakeClient(t, tc.objs...)}
			got, err := g.admitted(ctx(t), ownedByPod(claim("a", "trainer-gpu", "h100", 1), "trainer"))
			if err != nil || got != tc.want {
				t.Fatalf("admitted = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

// Issue 15: a workload Kueue admitted must not have a claim denied by the
// TenantQuota (its gang would hold GPUs and wait forever); the claim is
// still charged, so the next claim that bypasses Kueue is denied.
func TestClaimWebhookAdmitsKueueWorkloadOverQuota(t *testing.T) {
	objs := append(world(t), ns("a", nil), teamQuota("team-a", "a", "1"),
		allocatedTo(claim("a", "old", "h100", 1), "node-a", "gpu-0"), kueuePod(true), workload("job-uid", true))
	acct, c := newAccountant(t, objs...)
	h, _ := newClaimWebhook(t, acct)
	h.kueue = &kueueGate{reader: c}

	kc := ownedByPod(claim("a", "trainer-gpu", "h100", 1), "trainer")
	resp := h.Handle(ctx(t), request(t, admissionv1.Create, "a", kc.Name, kc))
	if !resp.Allowed || len(resp.Warnings) != 1 || !strings.Contains(resp.Warnings[0], "Kueue admitted workload a/job-trainer-job-1") {
		t.Fatalf("claim of the Kueue workload: allowed %v, warnings %q, result %+v", resp.Allowed, resp.Warnings, resp.Result)
	}
	usage, err := acct.Report(ctx(t), "team-a")
	if err != nil {
		t.Fatal(err)
	}
	if got := usage.Usage.Total().Units.String(); got != "2" {
		t.Errorf("tenant charged %s units after the overruled claim, want 2 (it is still charged)", got)
	}
	bypass := ownedByPod(claim("a", "bare-gpu", "h100", 1), "bare")
	bypass.OwnerReferences[0].UID = "bare-uid"
	if resp := h.Handle(ctx(t), request(t, admissionv1.Create, "a", bypass.Name, bypass)); resp.Allowed {
		t.Fatalf("a claim that bypasses Kueue was admitted over quota: %+v", resp.Result)
	}
}
