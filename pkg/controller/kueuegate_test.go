package controller

import (
	"strconv"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/kueue"
)

// The users claims are created as: the kube-controller-manager's
// resource-claim controller, and a tenant's own ServiceAccount.
const (
	kcmUser    = "system:serviceaccount:kube-system:resource-claim-controller"
	tenantUser = "system:serviceaccount:a:attacker"
)

func controllerRef(apiVersion, kind, name string, uid types.UID) metav1.OwnerReference {
	return metav1.OwnerReference{APIVersion: apiVersion, Kind: kind, Name: name, UID: uid, Controller: ptr.To(true)}
}

// jobRef names the admitted Job "trainer-job" (uid job-uid).
func jobRef() metav1.OwnerReference {
	return controllerRef("batch/v1", "Job", "trainer-job", "job-uid")
}

// gpuPod is a pod of namespace a asking for claim "gpu" from a template,
// controlled by owner (if any); Kueue's podset label marks the pods a
// Kueue admission started.
func gpuPod(name string, uid types.UID, owner *metav1.OwnerReference, podset bool) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: name, UID: uid, Labels: map[string]string{}},
		Spec:       corev1.PodSpec{ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptr.To("tmpl")}}},
	}
	if owner != nil {
		p.OwnerReferences = []metav1.OwnerReference{*owner}
	}
	if podset {
		p.Labels[kueuePodSetLabel] = "main"
	}
	return p
}

// kueuePod is the pod "trainer" (uid pod-uid) of the Job.
func kueuePod(podset bool) *corev1.Pod {
	return gpuPod("trainer", "pod-uid", ptr.To(jobRef()), podset)
}

// kueueWorkload is a Workload of namespace a owned by owners, charged
// milli GPU milli-units, with the conditions named true (Admitted, ...).
func kueueWorkloadObj(name string, owners []types.UID, milli int64, conditions ...string) *unstructured.Unstructured {
	conds := []any{}
	for _, c := range conditions {
		conds = append(conds, map[string]any{"type": c, "status": "True"})
	}
	wl := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
		"metadata": map[string]any{"namespace": "a", "name": name, "uid": "wl-" + name},
		"status":   map[string]any{"conditions": conds},
	}}
	if milli > 0 {
		wl.Object["status"].(map[string]any)["admission"] = map[string]any{
			"clusterQueue": "team-a",
			"podSetAssignments": []any{map[string]any{
				"name": "main", "flavors": map[string]any{kueue.DefaultResource: kueue.Flavor},
				"resourceUsage": map[string]any{kueue.DefaultResource: strconv.FormatInt(milli, 10)},
			}},
		}
	}
	refs := make([]metav1.OwnerReference, 0, len(owners))
	for _, uid := range owners {
		refs = append(refs, metav1.OwnerReference{APIVersion: "v1", Kind: "Owner", Name: string(uid), UID: uid})
	}
	wl.SetOwnerReferences(refs)
	return wl
}

// workload is the admitted Workload of the Job, charged one GPU.
func workload() *unstructured.Unstructured {
	return kueueWorkloadObj("job-trainer-job", []types.UID{"job-uid"}, 1000, "Admitted")
}

// kcmClaim is the claim the kube-controller-manager makes from the pod's
// template claim "gpu".
func kcmClaim(pod *corev1.Pod, name, class string, count int64) *resourceapi.ResourceClaim {
	c := claim("a", name, class, count)
	c.OwnerReferences = []metav1.OwnerReference{controllerRef("v1", "Pod", pod.Name, pod.UID)}
	c.Annotations = map[string]string{resourceapi.PodResourceClaimAnnotation: "gpu"}
	return c
}

func asUser(req admission.Request, user string) admission.Request {
	req.UserInfo.Username = user
	return req
}

func newKueueGate(acct *Accountant, c client.Client) *kueueGate {
	return &kueueGate{live: c, creators: sets.New(DefaultKueueClaimCreators...), acct: acct,
		book: &overruleBook{client: c, namespace: "gpuaas"}}
}

// newKueueWebhook is the quota webhook with the Kueue integration on.
func newKueueWebhook(t *testing.T, objs ...client.Object) (*claimWebhook, *Accountant, client.WithWatch) {
	t.Helper()
	acct, c := newAccountant(t, append(world(t), objs...)...)
	h, _ := newClaimWebhook(t, acct)
	h.kueue = newKueueGate(acct, c)
	return h, acct, c
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

// Issue 15: a workload Kueue admitted must not have a claim denied by the
// TenantQuota (its gang would hold GPUs and wait forever); the claim is
// still charged, so the next claim that bypasses Kueue is denied.
func TestClaimWebhookAdmitsKueueWorkloadOverQuota(t *testing.T) {
	h, acct, _ := newKueueWebhook(t, ns("a", nil), teamQuota("team-a", "a", "1"),
		allocatedTo(claim("a", "old", "h100", 1), "node-a", "gpu-0"), kueuePod(true),
		kueueWorkloadObj("job-trainer-job", []types.UID{"job-uid"}, 2000, "Admitted"))

	kc := kcmClaim(kueuePod(true), "trainer-gpu", "h100", 1)
	resp := h.Handle(ctx(t), asUser(request(t, admissionv1.Create, "a", kc.Name, kc), kcmUser))
	if !resp.Allowed || len(resp.Warnings) != 1 || !strings.Contains(resp.Warnings[0], "Kueue admitted workload a/job-trainer-job") {
		t.Fatalf("claim of the Kueue workload: allowed %v, warnings %q, result %+v", resp.Allowed, resp.Warnings, resp.Result)
	}
	usage, err := acct.Report(ctx(t), "team-a")
	if err != nil {
		t.Fatal(err)
	}
	if got := usage.Usage.Total().Units.String(); got != "2" {
		t.Errorf("tenant charged %s units after the overruled claim, want 2 (it is still charged)", got)
	}
	bypass := kcmClaim(gpuPod("bare", "bare-uid", nil, false), "bare-gpu", "h100", 1)
	if resp := h.Handle(ctx(t), asUser(request(t, admissionv1.Create, "a", bypass.Name, bypass), kcmUser)); resp.Allowed {
		t.Fatalf("a claim that bypasses Kueue was admitted over quota: %+v", resp.Result)
	}
}

// Issue 26 item 1: every way a tenant could dress a claim up as Kueue's,
// and the limits the overrule must not lift. Each case is denied; before
// the fix each was admitted over the quota.
func TestClaimWebhookKueueOverruleRoutes(t *testing.T) {
	quota := teamQuota("team-a", "a", "1")
	old := allocatedTo(claim("a", "old", "h100", 1), "node-a", "gpu-0")
	trainerClaim := allocatedTo(kcmClaim(kueuePod(true), "trainer-gpu", "h100", 1), "node-a", "gpu-1")
	bare := gpuPod("bare", "bare-uid", ptr.To(jobRef()), true)
	noH100 := tenantQuota("team-a", 0, gpuaas.TenantQuotaSpec{Namespaces: []string{"a"},
		Limits: gpuaas.QuotaLimits{GpuUnits: qty("8"), Devices: map[string]int64{"h100": 0}}})
	invalid := tenantQuota("team-a", 0, gpuaas.TenantQuotaSpec{Namespaces: []string{"a"}, Limits: gpuaas.QuotaLimits{GpuUnits: qty("-1")}})

	cases := map[string]struct {
		objs   []client.Object
		claim  *resourceapi.ResourceClaim
		user   string
		opts   func(*Accountant)
		reason string
	}{
		// A hand-made claim naming a real pod of the admitted Job.
		"forged ownerRef on a tenant's claim": {
			objs:  []client.Object{quota, old, kueuePod(true), workload()},
			claim: kcmClaim(kueuePod(true), "forged", "h100", 1), user: tenantUser,
			reason: `TenantQuota "team-a" exceeded`,
		},
		// A bare pod with the podset label and the Job as its controller:
		// the kube-controller-manager makes its claim, but the Job's own
		// pod already holds all Kueue charged.
		"bare pod with the podset label naming the Job": {
			objs:  []client.Object{quota, kueuePod(true), trainerClaim, bare, workload()},
			claim: kcmClaim(bare, "bare-gpu", "h100", 1), user: kcmUser,
			reason: "over what Kueue charged workload job-trainer-job",
		},
		"over what Kueue charged": {
			objs:  []client.Object{quota, old, kueuePod(true), workload()},
			claim: kcmClaim(kueuePod(true), "trainer-gpu", "h100", 2), user: kcmUser,
			reason: "this claim needs 2000",
		},
		"finished workload": {
			objs:  []client.Object{quota, old, kueuePod(true), kueueWorkloadObj("wl", []types.UID{"job-uid"}, 1000, "Admitted", "Finished")},
			claim: kcmClaim(kueuePod(true), "trainer-gpu", "h100", 1), user: kcmUser,
			reason: `TenantQuota "team-a" exceeded`,
		},
		"evicted workload": {
			objs:  []client.Object{quota, old, kueuePod(true), kueueWorkloadObj("wl", []types.UID{"job-uid"}, 1000, "Admitted", "Evicted")},
			claim: kcmClaim(kueuePod(true), "trainer-gpu", "h100", 1), user: kcmUser,
			reason: `TenantQuota "team-a" exceeded`,
		},
		// A class that spans kinds, charged as GPU units by Kueue, must not
		// hand out an H100 to a tenant whose H100 limit is 0.
		"device limit of another profile": {
			objs:  []client.Object{noH100, genericClass(), kueuePod(true), workload()},
			claim: kcmClaim(kueuePod(true), "trainer-gpu", "any-gpu", 1), user: kcmUser,
			reason: `devices of profile "h100"`,
		},
		"namespace of no tenant with denyUnassigned": {
			objs:  []client.Object{kueuePod(true), workload()},
			claim: kcmClaim(kueuePod(true), "trainer-gpu", "h100", 1), user: kcmUser,
			opts:   func(a *Accountant) { a.DenyUnassigned = true },
			reason: "belongs to no TenantQuota",
		},
		"invalid TenantQuota": {
			objs:  []client.Object{invalid, kueuePod(true), workload()},
			claim: kcmClaim(kueuePod(true), "trainer-gpu", "h100", 1), user: kcmUser,
			reason: "is invalid",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			h, acct, _ := newKueueWebhook(t, append(tc.objs, ns("a", nil))...)
			if tc.opts != nil {
				tc.opts(acct)
			}
			resp := h.Handle(ctx(t), asUser(request(t, admissionv1.Create, "a", tc.claim.Name, tc.claim), tc.user))
			if resp.Allowed {
				t.Fatalf("admitted (warnings %q), want denied", resp.Warnings)
			}
			if msg := resp.Result.Message; !strings.Contains(msg, tc.reason) {
				t.Errorf("denied with %q, want it to say %q", msg, tc.reason)
			}
		})
	}
}

// The cap counts what was overruled for a workload as recorded at
// admission, so a tenant that detaches an overruled pod from the Job
// afterwards (its ownerReferences are the tenant's to edit) cannot spend
// the Job's charge twice.
func TestClaimWebhookKueueCapSurvivesDetachedPods(t *testing.T) {
	zero := teamQuota("team-a", "a", "0")
	first := gpuPod("first", "first-uid", ptr.To(jobRef()), true)
	h, acct, c := newKueueWebhook(t, ns("a", nil), zero, first, workload())
	kc := kcmClaim(first, "first-gpu", "h100", 1)
	if resp := h.Handle(ctx(t), asUser(request(t, admissionv1.Create, "a", kc.Name, kc), kcmUser)); !resp.Allowed {
		t.Fatalf("first claim within Kueue's charge denied: %+v", resp.Result)
	}
	if err := c.Create(ctx(t), kc); err != nil { // the apiserver stores it
		t.Fatal(err)
	}
	acct.ClaimChanged("a")
	first.OwnerReferences = nil // the tenant detaches the pod
	if err := c.Update(ctx(t), first); err != nil {
		t.Fatal(err)
	}
	second := gpuPod("second", "second-uid", ptr.To(jobRef()), true)
	if err := c.Create(ctx(t), second); err != nil {
		t.Fatal(err)
	}
	kc2 := kcmClaim(second, "second-gpu", "h100", 1)
	resp := h.Handle(ctx(t), asUser(request(t, admissionv1.Create, "a", kc2.Name, kc2), kcmUser))
	if resp.Allowed {
		t.Fatal("a second claim was overruled on the charge the first one spent")
	}
	if !strings.Contains(resp.Result.Message, "its pods' claims hold 1000") {
		t.Errorf("denied with %q, want the recorded 1000 counted", resp.Result.Message)
	}
}

// A dry run decides as the real request would, and records nothing.
func TestClaimWebhookKueueDryRunRecordsNothing(t *testing.T) {
	h, _, c := newKueueWebhook(t, ns("a", nil), teamQuota("team-a", "a", "0"), kueuePod(true), workload())
	kc := kcmClaim(kueuePod(true), "trainer-gpu", "h100", 1)
	req := asUser(request(t, admissionv1.Create, "a", kc.Name, kc), kcmUser)
	req.DryRun = ptr.To(true)
	if resp := h.Handle(ctx(t), req); !resp.Allowed {
		t.Fatalf("dry run of a claim within Kueue's charge denied: %+v", resp.Result)
	}
	var cm corev1.ConfigMap
	if err := c.Get(ctx(t), types.NamespacedName{Namespace: "gpuaas", Name: overruleBookPrefix + "a"}, &cm); err == nil {
		t.Errorf("a dry run wrote the overrule book: %v", cm.Data)
	}
	req.DryRun = nil
	if resp := h.Handle(ctx(t), req); !resp.Allowed {
		t.Fatalf("claim within Kueue's charge denied: %+v", resp.Result)
	}
	if err := c.Get(ctx(t), types.NamespacedName{Namespace: "gpuaas", Name: overruleBookPrefix + "a"}, &cm); err != nil ||
		!strings.Contains(cm.Data[overruleBookKey], string(kc.UID)) {
		t.Errorf("the overruled claim is not in the book: %v, %v", cm.Data, err)
	}
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

// Kueue refuses workloads with firstAvailable requests, so such a claim is
// never overruled for Kueue and is trimmed like any other.
func TestAlternativesWebhookTrimsKueueWorkloadsToo(t *testing.T) {
	objs := append(world(t), ns("a", nil), kueuePod(true), workload(),
		tenantQuota("no-h100", 0, gpuaas.TenantQuotaSpec{Namespaces: []string{"a"},
			Limits: gpuaas.QuotaLimits{GpuUnits: qty("8"), Devices: map[string]int64{"h100": 0}}}))
	acct, _ := newAccountant(t, objs...)
	s, err := Scheme()
	if err != nil {
		t.Fatal(err)
	}
	trimmer := &alternativesWebhook{acct: acct, decoder: admission.NewDecoder(s)}
	kc := withAlternatives("a", "trainer-gpu", "h100", "mig-1g")
	kc.OwnerReferences = kcmClaim(kueuePod(true), kc.Name, "h100", 1).OwnerReferences
	resp := trimmer.Handle(ctx(t), asUser(request(t, admissionv1.Create, "a", kc.Name, kc), kcmUser))
	if len(resp.Patches) != 1 {
		t.Fatalf("claim of a Kueue pod: patches %+v, want its H100 dropped", resp.Patches)
	}
}
