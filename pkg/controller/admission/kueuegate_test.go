package admission

import (
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/kueue"
)

// newKueueGate is the gate with the default creators
// (controller.DefaultKueueClaimCreators).
func newKueueGate(acct *Accountant, c client.Client) *KueueGate {
	return NewKueueGate(c, c, "gpuaas", []string{kcmUser, "system:kube-controller-manager"}, acct)
}

func TestKueueGateFindsTheAdmittedWorkload(t *testing.T) {
	trainer := kueuePod(true)
	// A JobSet's pod: its Job is read back, the JobSet is named by the
	// Workload and not read.
	jsJob := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "js-job", UID: "js-job-uid",
		OwnerReferences: []metav1.OwnerReference{controllerRef("jobset.x-k8s.io/v1alpha2", "JobSet", "js", "jobset-uid")}}}
	jsPod := gpuPod("js-pod", "js-pod-uid", ptr.To(controllerRef("batch/v1", "Job", "js-job", "js-job-uid")), true)
	// A LeaderWorkerSet has a Workload per group; the pod names its own.
	lwsSet := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "lws-0", UID: "sts-uid",
		OwnerReferences: []metav1.OwnerReference{controllerRef("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "lws", "lws-uid")}}}
	lwsPod := gpuPod("lws-0-1", "lws-pod-uid", ptr.To(controllerRef("apps/v1", "StatefulSet", "lws-0", "sts-uid")), true)
	lwsPod.Labels[kueuePrebuiltWorkload] = "lws-group-1"
	lwsGroups := []client.Object{lwsSet, lwsPod,
		kueueWorkloadObj("lws-group-0", []types.UID{"lws-uid"}, 1000, "Admitted"),
		kueueWorkloadObj("lws-group-1", []types.UID{"lws-uid"}, 1000, "Admitted")}
	// A plain pod group: Kueue lists every pod as an owner.
	grouped := gpuPod("group-1", "group-1-uid", nil, true)
	// A Job of the same name made again: the pod's reference is stale.
	otherJob := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "js-job", UID: "another-uid",
		OwnerReferences: []metav1.OwnerReference{controllerRef("jobset.x-k8s.io/v1alpha2", "JobSet", "js", "jobset-uid")}}}
	namesOther := trainer.DeepCopy()
	namesOther.Status.ResourceClaimStatuses = []corev1.PodResourceClaimStatus{{Name: "gpu", ResourceClaimName: ptr.To("someone-else")}}
	byName := trainer.DeepCopy()
	byName.Spec.ResourceClaims[0] = corev1.PodResourceClaim{Name: "gpu", ResourceClaimName: ptr.To("trainer-gpu")}

	cases := map[string]struct {
		objs  []client.Object
		pod   *corev1.Pod
		user  string
		claim func(*resourceapi.ResourceClaim)
		want  string
	}{
		"admitted workload of the pod's job": {objs: []client.Object{trainer, workload()}, want: "job-trainer-job"},
		// Issue 26 item 1: a claim the tenant made itself, naming a pod
		// of an admitted Job, is the tenant's word only.
		"claim made by a tenant": {objs: []client.Object{trainer, workload()}, user: tenantUser},
		"claim not made for a pod template": {objs: []client.Object{trainer, workload()},
			claim: func(c *resourceapi.ResourceClaim) { c.Annotations = nil }},
		"pod asks for a claim by name":          {objs: []client.Object{byName, workload()}, pod: byName},
		"pod holds another claim already":       {objs: []client.Object{namesOther, workload()}, pod: namesOther},
		"another pod of the same name":          {objs: []client.Object{gpuPod("trainer", "new-uid", ptr.To(jobRef()), true), workload()}},
		"label but no workload":                 {objs: []client.Object{trainer}},
		"workload not admitted":                 {objs: []client.Object{trainer, kueueWorkloadObj("wl", []types.UID{"job-uid"}, 0, "QuotaReserved")}},
		"workload finished":                     {objs: []client.Object{trainer, kueueWorkloadObj("wl", []types.UID{"job-uid"}, 1000, "Admitted", "Finished")}},
		"workload evicted":                      {objs: []client.Object{trainer, kueueWorkloadObj("wl", []types.UID{"job-uid"}, 1000, "Admitted", "Evicted")}},
		"another job's workload":                {objs: []client.Object{trainer, kueueWorkloadObj("wl", []types.UID{"other-uid"}, 1000, "Admitted")}},
		"pod Kueue did not start":               {objs: []client.Object{kueuePod(false), workload()}, pod: kueuePod(false)},
		"pod gone (claim left over)":            {objs: []client.Object{workload()}},
		"JobSet: through the pod's Job":         {objs: []client.Object{jsJob, jsPod, kueueWorkloadObj("js", []types.UID{"jobset-uid"}, 1000, "Admitted")}, pod: jsPod, want: "js"},
		"JobSet: the Job is another object":     {objs: []client.Object{otherJob, jsPod, kueueWorkloadObj("js", []types.UID{"jobset-uid"}, 1000, "Admitted")}, pod: jsPod},
		"LeaderWorkerSet: the pod's group":      {objs: lwsGroups, pod: lwsPod, want: "lws-group-1"},
		"plain pod group: any member's pod":     {objs: []client.Object{grouped, kueueWorkloadObj("group", []types.UID{"group-0-uid", "group-1-uid"}, 2000, "Admitted")}, pod: grouped, want: "group"},
		"bare pod naming no owner":              {objs: []client.Object{gpuPod("bare", "bare-uid", nil, true), workload()}, pod: gpuPod("bare", "bare-uid", nil, true)},
		"owner chain that leads to no Workload": {objs: []client.Object{jsJob, jsPod}, pod: jsPod},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			acct, c := newAccountant(t, tc.objs...)
			g := newKueueGate(acct, c)
			pod := cmpOr(tc.pod, trainer)
			kc := kcmClaim(pod, pod.Name+"-gpu", "h100", 1)
			if tc.claim != nil {
				tc.claim(kc)
			}
			wl, _, why, err := g.workloadFor(ctx(t), kc, cmpOrString(tc.user, kcmUser), newOwnerWalk(c))
			got := ""
			if wl != nil {
				got = wl.name
			}
			if err != nil || got != tc.want {
				t.Fatalf("workload = %q (%s), %v; want %q", got, why, err, tc.want)
			}
			if got == "" && why == "" {
				t.Error("no workload, and no reason why")
			}
		})
	}
}

func cmpOr(p, def *corev1.Pod) *corev1.Pod {
	if p != nil {
		return p
	}
	return def
}

func cmpOrString(s, def string) string {
	if s != "" {
		return s
	}
	return def
}

// Kueue charges a device its gpu-milliunits counter, rounded down per
// device, and nothing for requests it refuses.
func TestKueueCharge(t *testing.T) {
	shared := gpuProfile("shared", gpuaas.ProfileSelector{Type: "shared"})
	acct, _ := newAccountant(t, append(world(t), shared, classOf(t, shared), genericClass())...)
	alternatives := withAlternatives("a", "alt", "h100", "mig-1g")
	for name, tc := range map[string]struct {
		spec      *resourceapi.ResourceClaimSpec
		milli     int64
		uncharged string
	}{
		"whole GPU":            {spec: &claim("a", "c", "h100", 2).Spec, milli: 2000},
		"seven 1g slices":      {spec: &claim("a", "c", "mig-1g", 7).Spec, milli: 994},
		"class of no profile":  {spec: &claim("a", "c", "any-gpu", 1).Spec, milli: 1000},
		"firstAvailable":       {spec: &alternatives.Spec, milli: 1000, uncharged: "firstAvailable"},
		"a shared GPU's share": {spec: &claim("a", "c", "shared", 1).Spec, uncharged: "does not charge class shared"},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := acct.kueueCharge(ctx(t), tc.spec)
			if err != nil {
				t.Fatal(err)
			}
			if got.milli[kueue.DefaultResource] != tc.milli || !strings.Contains(got.uncharged, tc.uncharged) || (tc.uncharged == "") != (got.uncharged == "") {
				t.Errorf("charge = %v (uncharged %q), want %d milli-units (uncharged %q)", got.milli, got.uncharged, tc.milli, tc.uncharged)
			}
		})
	}
}
