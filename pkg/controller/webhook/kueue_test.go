package webhook

import (
	"fmt"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	quotaadmission "github.com/gpuaas/gpu-dra-driver/pkg/controller/admission"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller/internal/testworld"
)

// The quota webhook with the Kueue integration on: claims the quota denies
// go to the gate (pkg/controller/admission's kueuegate.go and kueuecap.go,
// where the gate's own tests are).

func asUser(req admission.Request, user string) admission.Request {
	req.UserInfo.Username = user
	return req
}

// newKueueWebhook is the quota webhook with the Kueue integration on.
func newKueueWebhook(t *testing.T, objs ...client.Object) (*claimWebhook, *quotaadmission.Accountant, client.WithWatch) {
	t.Helper()
	acct, c := newAccountant(t, append(world(t), objs...)...)
	h, _ := newClaimWebhook(t, acct)
	h.kueue = quotaadmission.NewKueueGate(c, c, "gpuaas", []string{kcmUser, "system:kube-controller-manager"}, acct)
	return h, acct, c
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
		opts   func(*quotaadmission.Accountant)
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
		// Issue 36 route 1: the tenant's bare pods hold its whole limit, which
		// Kueue never sees, so Kueue admits a Job on an empty queue. Its
		// claims may not stack on the bare usage: the tenant's GPUs stay
		// within the larger of its limit and what Kueue charged.
		"bare usage first, then a Kueue Job": {
			objs: []client.Object{teamQuota("team-a", "a", "2"),
				allocatedTo(claim("a", "bare-0", "h100", 1), "node-a", "gpu-0"),
				allocatedTo(claim("a", "bare-1", "h100", 1), "node-a", "gpu-1"),
				kueuePod(true), kueueWorkloadObj("job-trainer-job", []types.UID{"job-uid"}, 2000, "Admitted")},
			claim: kcmClaim(kueuePod(true), "trainer-gpu", "h100", 2), user: kcmUser,
			reason: "Kueue charged the active workloads of TenantQuota \"team-a\" 2 GPU units",
		},
		// Issue 36 route 2: a claim overruled for an earlier Job, whose pod
		// is gone and whose ownerReference the tenant removed, is bare usage
		// now; the next Job is not overruled on top of it.
		"claim of an ended Job left over": {
			objs: []client.Object{teamQuota("team-a", "a", "0"), claim("a", "left-over", "h100", 1),
				kueuePod(true), workload()},
			claim: kcmClaim(kueuePod(true), "trainer-gpu", "h100", 1), user: kcmUser,
			reason: "Kueue charged the active workloads of TenantQuota \"team-a\" 1 GPU units",
		},
		"namespace of no tenant with denyUnassigned": {
			objs:  []client.Object{kueuePod(true), workload()},
			claim: kcmClaim(kueuePod(true), "trainer-gpu", "h100", 1), user: kcmUser,
			opts:   func(a *quotaadmission.Accountant) { a.DenyUnassigned = true },
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
	var cms corev1.ConfigMapList
	if err := c.List(ctx(t), &cms, client.InNamespace("gpuaas")); err != nil || len(cms.Items) > 0 {
		t.Errorf("a dry run wrote a book: %v, %v", cms.Items, err)
	}
	var cm corev1.ConfigMap
	req.DryRun = nil
	if resp := h.Handle(ctx(t), req); !resp.Allowed {
		t.Fatalf("claim within Kueue's charge denied: %+v", resp.Result)
	}
	// The overrule book of namespace a (kueuecap.go's overruleBookPrefix and
	// overruleBookKey).
	if err := c.Get(ctx(t), types.NamespacedName{Namespace: "gpuaas", Name: "gpuaas-kueue-overrules-a"}, &cm); err != nil ||
		!strings.Contains(cm.Data["overrules"], string(kc.UID)) {
		t.Errorf("the overruled claim is not in the book: %v, %v", cm.Data, err)
	}
}

// Kueue refuses workloads with firstAvailable requests, so such a claim is
// never overruled for Kueue and is trimmed like any other.
func TestAlternativesWebhookTrimsKueueWorkloadsToo(t *testing.T) {
	objs := append(world(t), ns("a", nil), kueuePod(true), workload(),
		tenantQuota("no-h100", 0, gpuaas.TenantQuotaSpec{Namespaces: []string{"a"},
			Limits: gpuaas.QuotaLimits{GpuUnits: qty("8"), Devices: map[string]int64{"h100": 0}}}))
	acct, _ := newAccountant(t, objs...)
	s, err := testworld.Scheme()
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

// Kueue charges each device its units in thousandths rounded down (a 1g
// MIG device, 1/7, is 142), so a workload's devices hold a little more
// than Kueue's sum. The tenant's cap on an overrule (issue 36 route 1)
// allows for that: seven 1g devices charged 994 fit, six of them held
// outside the workload.
func TestClaimWebhookKueueCapAllowsForRounding(t *testing.T) {
	objs := []client.Object{ns("a", nil), teamQuota("team-a", "a", "0"), kueuePod(true),
		kueueWorkloadObj("job-trainer-job", []types.UID{"job-uid"}, 7*142, "Admitted")}
	for i := range 6 {
		objs = append(objs, allocatedTo(claim("a", fmt.Sprintf("held-%d", i), "mig-1g", 1), "node-b", fmt.Sprintf("gpu-0-mig-1g-%d", i)))
	}
	h, _, _ := newKueueWebhook(t, objs...)
	kc := kcmClaim(kueuePod(true), "trainer-gpu", "mig-1g", 1)
	resp := h.Handle(ctx(t), asUser(request(t, admissionv1.Create, "a", kc.Name, kc), kcmUser))
	if !resp.Allowed {
		t.Fatalf("the seventh 1g device of a workload charged 994 was denied: %s", resp.Result.Message)
	}
	over := kcmClaim(kueuePod(true), "trainer-gpu", "mig-1g", 2)
	resp = h.Handle(ctx(t), asUser(request(t, admissionv1.Create, "a", over.Name, over), kcmUser))
	if resp.Allowed {
		t.Fatal("an eighth 1g device was admitted on a charge of seven")
	}
}
