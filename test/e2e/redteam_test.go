package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	resourceclient "k8s.io/client-go/kubernetes/typed/resource/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller"
	"github.com/gpuaas/gpu-dra-driver/pkg/kueue"
	"github.com/gpuaas/gpu-dra-driver/pkg/quota"
	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

// The red team: a tenant that tries to hold more GPUs than its TenantQuota
// allows, acting only as its own ServiceAccount (admin of its namespace,
// as a platform sets teams up), against the real control plane, the real
// Kueue manager and the dra-controller with its Kueue integration on.
// After every attack, the cluster admin checks from the API that the
// tenant holds no more than its limit (each claim priced afresh, not by
// the controller's cache) and that a peer of its cohort still gets a GPU
// within its own limit: an overrun would come out of the cohort.
//
// Adding a route is adding an entry to redTeamRoutes.

// Each tenant's limit, in GPU units, and its peer's. The tenant's Kueue
// Job holds one of its two units, so an attack that asks for two more is
// over the limit whichever way it is priced.
const (
	redTeamLimit     = "2"
	redTeamPeerLimit = "1"
)

// redTeamRoute is one way of attacking the quota. attack runs as the
// tenant and checks the attack was refused where it was tried; the
// containment checks follow for every route.
type redTeamRoute struct {
	name   string
	attack func(t *testing.T, ctx context.Context, env *redTeamEnv)
}

var redTeamRoutes = []redTeamRoute{
	// Issue 26 item 1a: a hand-made claim whose controller is a real pod
	// of the admitted Job, dressed with the annotation the
	// kube-controller-manager puts on claims it makes.
	{name: "ForgedOwnerRefClaim", attack: attackForgedOwnerRef},
	// Issue 26 item 1b: a bare pod with Kueue's podset label and the
	// admitted Job as its controller; the kube-controller-manager makes
	// its claim.
	{name: "BarePodUnderAdmittedJob", attack: attackBarePod},
	// Issue 26 item 2: a dry run primes the pricing cache so that a dearer
	// claim, whose key collided, is priced as the cheap one.
	{name: "PricingCacheCollision", attack: attackPricingCache},
	// The overrule trusts Kueue's Workloads: the tenant must not be able
	// to write one, nor the charge of its admitted one.
	{name: "ForgedWorkload", attack: attackForgedWorkload},
	// Kueue's labels alone (podset, pod group, prebuilt workload) on a
	// bare pod with no owner: labels are the tenant's word only.
	{name: "BarePodWithKueueLabels", attack: attackKueueLabels},
	// A pod whose controller is the Job's own pod: the walk up the
	// owners reaches the admitted Job, and the cap still holds.
	{name: "PodUnderTheJobsPod", attack: attackPodUnderJobPod},
	// A claim admitted small, then made bigger.
	{name: "GrowAnAdmittedClaim", attack: attackGrowClaim},
	// What decides the quota, out of the tenant's reach: the exemption
	// label on its namespace, the catalog, the TenantQuota itself.
	{name: "ClusterScopedLevers", attack: attackClusterScoped},
	// Issue 26 item 6: a tenant allowed to borrow takes its peer's idle
	// quota with bare claims no pod ever uses, locking the peer out of
	// its own quota for as long as they exist.
	{name: "BorrowerLocksLenderOut", attack: attackLockLenderOut},
	// Issue 26 item 5: the webhook runs before the create, so re-running
	// a create of a name that exists is admitted (here, by borrowing the
	// peer's idle unit), then fails AlreadyExists; each reservation held
	// the peer's unit for 35 s with nothing in the API.
	{name: "RerunCreateHoldsQuota", attack: attackRerunCreate},
	// Issue 26 item 4: a second controller replica whose ResourceClaim
	// watch lags admits what the first one stopped reserving because its
	// own cache showed it (redteam_replicas_test.go).
	{name: "LaggingReplica", attack: attackLaggingReplica},
	// Issue 36 route 1: bare claims take the tenant's whole limit, which
	// Kueue does not see; then a Job that Kueue admits on its empty queue.
	{name: "BareUsageThenKueueJob", attack: attackBareThenKueueJob},
	// Issue 36 route 2: a claim admitted past the quota for a Job, its
	// ownerReference removed and the Job deleted, kept for bare pods.
	{name: "OverruledClaimOutlivesJob", attack: attackOverruledClaimOutlivesJob},
	// Issue 36 route 3: a re-run create of a name the tenant holds, with
	// a dearer spec, admitted by borrowing and then AlreadyExists.
	{name: "DearerRerunLocksLenderOut", attack: attackDearerRerun},
	// Issue 55 route 6: a claim admitted past the quota for a Job, its
	// controller ownerReference pointed at a never-ending pod of the
	// tenant's own and the Job deleted, kept for as long as that pod runs.
	{name: "OverruledClaimNamesAnotherPod", attack: attackOverruledClaimNamesAnotherPod},
}

// redTeamReclaimAfter is the controller's ReclaimUnallocatedAfter here:
// short, so BorrowerLocksLenderOut need not wait the default 10 minutes.
const redTeamReclaimAfter = 3 * time.Second

// redTeamEnv is one route's world.
type redTeamEnv struct {
	ns, peerNS   string
	tenant, peer string // TenantQuota names
	job          string // the tenant's admitted Kueue Job
	jobUID       types.UID
	jobPod       *v1.Pod
	spanning     string // a DeviceClass of every kind of device
	attacker     *framework.Tenant
	attackerDyn  dynamic.Interface
	// webhook is the address the API server calls the webhook at,
	// relayed to replica A, the controller whose options replicaA are:
	// LaggingReplica puts a second replica behind it.
	webhook  *framework.TCPSwitch
	replicaA controller.Options
}

// claims are the attacker's ResourceClaims client.
func (env *redTeamEnv) claims() resourceclient.ResourceClaimInterface {
	return env.attacker.Client.ResourceV1().ResourceClaims(env.ns)
}

func TestRedTeam(t *testing.T) {
	startNode(t)
	ctx := framework.Context(t, 20*time.Minute)
	applySharingClasses(t, ctx)
	webhook := redTeamWebhookSwitch(t)
	var replicaA controller.Options
	startKueueWithController(t, framework.KueueOptions{Resources: kueue.Resources(kueueCharges)},
		func(o *controller.Options) {
			o.ReclaimUnallocatedAfter = redTeamReclaimAfter
			asReplicaBehind(o, webhook)
			replicaA = *o
		})
	spanning := spanningClass(t)
	for _, route := range redTeamRoutes {
		t.Run(route.name, func(t *testing.T) {
			env := newRedTeamEnv(t, spanning)
			env.webhook, env.replicaA = webhook, replicaA
			ctx := framework.Context(t, 5*time.Minute)
			route.attack(t, ctx, env)
			env.checkContained(t, ctx)
		})
	}
}

// spanningClass is a DeviceClass of the cluster admin's catalog that
// matches every device of ours: whole GPUs, MIG devices, replicas, shares.
func spanningClass(t *testing.T) string {
	t.Helper()
	ctx := framework.Context(t, time.Minute)
	dc := &resourceapi.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: uniqueName("redteam-any")},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
			Expression: fmt.Sprintf("device.driver == %q", framework.DriverName),
		}}}},
	}
	if _, err := cp.Client.ResourceV1().DeviceClasses().Create(ctx, dc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cp.Client.ResourceV1().DeviceClasses().Delete(context.Background(), dc.Name, metav1.DeleteOptions{}); err != nil {
			t.Errorf("deleting DeviceClass %s: %v", dc.Name, err)
		}
	})
	return dc.Name
}

// newRedTeamEnv sets up a tenant (TenantQuota of redTeamLimit units, no
// borrowing, in a cohort with a peer of redTeamPeerLimit), its Kueue queue and a Job of one
// whole GPU that Kueue admitted and whose claim exists, and the attacker:
// the tenant's own ServiceAccount.
func newRedTeamEnv(t *testing.T, spanning string) *redTeamEnv {
	t.Helper()
	ctx := framework.Context(t, 3*time.Minute)
	kq := &kueueHelper{t: t}
	env := &redTeamEnv{spanning: spanning, job: "trainer",
		ns: kq.team("redteam", "", 1000, nil), peerNS: cp.CreateNamespace(t, "redteam-peer"),
		tenant: uniqueName("redteam"), peer: uniqueName("redteam-peer")}
	cohort := uniqueName("redteam")
	qa := quotaFor(env.tenant, []string{env.ns}, gpuaas.QuotaLimits{GpuUnits: units(redTeamLimit)})
	qb := quotaFor(env.peer, []string{env.peerNS}, gpuaas.QuotaLimits{GpuUnits: units(redTeamPeerLimit)})
	// The tenant borrows nothing: whatever it holds past its own limit
	// is an overrun, not a loan from its peer.
	qa.Spec.Cohort, qb.Spec.Cohort = cohort, cohort
	qa.Spec.BorrowingLimit = &gpuaas.BorrowingLimit{GpuUnits: units("0")}
	createObject(t, qa)
	createObject(t, qb)
	for _, q := range []string{env.tenant, env.peer} {
		waitForQuota(t, q, "enforced", func(q *gpuaas.TenantQuota) bool { return len(q.Status.Namespaces) == 1 })
	}

	kq.job(ctx, env.ns, env.job, jobSpec{class: "gpu.gpuaas.io"})
	if got := kq.waitAdmitted(ctx, env.ns, env.job); got != 1000 {
		t.Fatalf("Kueue charged the Job %d milli-units, want 1000", got)
	}
	kq.poll(ctx, "the Job's pod and its claim", func(ctx context.Context) (bool, error) {
		pods := kq.jobPods(ctx, env.ns, env.job)
		if len(pods) != 1 || len(pods[0].Status.ResourceClaimStatuses) != 1 {
			return false, nil
		}
		env.jobPod = &pods[0]
		return true, nil
	})
	job, err := cp.Client.BatchV1().Jobs(env.ns).Get(ctx, env.job, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	env.jobUID = job.UID

	if env.attacker, err = cp.NewTenant(ctx, env.ns, "attacker"); err != nil {
		t.Fatal(err)
	}
	if env.attackerDyn, err = dynamic.NewForConfig(env.attacker.Config); err != nil {
		t.Fatal(err)
	}
	return env
}

// checkContained: the tenant holds no more than its limit, each of its
// claims priced at its worst case by a pricer of its own (not the
// controller's, whose cache an attack may have poisoned); and its cohort
// peer is admitted within its own limit.
func (env *redTeamEnv) checkContained(t *testing.T, ctx context.Context) {
	t.Helper()
	held, claims := tenantHolds(t, ctx, env.ns)
	if held.Cmp(quota.UnitsFromQuantity(*units(redTeamLimit))) > 0 {
		t.Errorf("tenant %s holds %s GPU units, over its limit %s: %v", env.tenant, held, redTeamLimit, claims)
	}
	peerClaim := gpuClaim(env.peerNS, uniqueName("peer"), "gpu.gpuaas.io", 1)
	if err := createClaim(ctx, peerClaim); err != nil {
		t.Errorf("the cohort peer was refused a GPU within its own limit: %v", err)
	}
}

// tenantHolds prices every claim of the namespace at its worst case,
// against the published devices and classes as the API shows them now.
func tenantHolds(t *testing.T, ctx context.Context, ns string) (quota.Units, []string) {
	t.Helper()
	sl, err := cp.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dcs, err := cp.Client.ResourceV1().DeviceClasses().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var profiles gpuaas.GpuProfileList
	if err := ctrlClient.List(ctx, &profiles, client.InNamespace("")); err != nil {
		t.Fatal(err)
	}
	slicePtrs := make([]*resourceapi.ResourceSlice, len(sl.Items))
	for i := range sl.Items {
		slicePtrs[i] = &sl.Items[i]
	}
	classes := map[string]*resourceapi.DeviceClass{}
	for i := range dcs.Items {
		classes[dcs.Items[i].Name] = &dcs.Items[i]
	}
	names := map[string]bool{}
	for _, p := range profiles.Items {
		names[p.Name] = true
	}
	pricer := quota.NewPricer(quota.NewInventory(quota.DriverName, slicePtrs), classes, names)
	claims, err := cp.Client.ResourceV1().ResourceClaims(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var total quota.Units
	var seen []string
	for i := range claims.Items {
		c := pricer.ClaimCost(ctx, &claims.Items[i].Spec)
		total = total.Add(c.Units)
		seen = append(seen, claims.Items[i].Name+"="+c.Units.String())
	}
	return total, seen
}

func attackForgedOwnerRef(t *testing.T, ctx context.Context, env *redTeamEnv) {
	c := gpuClaim(env.ns, "forged", "gpu.gpuaas.io", 2)
	c.Annotations = map[string]string{resourceapi.PodResourceClaimAnnotation: "gpu"}
	c.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod",
		Name: env.jobPod.Name, UID: env.jobPod.UID, Controller: ptr.To(true)}}
	_, err := env.claims().Create(ctx, c, metav1.CreateOptions{})
	refused(t, err, `TenantQuota "`+env.tenant+`" exceeded`)
}

func attackBarePod(t *testing.T, ctx context.Context, env *redTeamEnv) {
	// No labels of the Job's selector: the Job controller does not count
	// the pod among its own (it lets it go, a second later).
	pod := env.templatePod(t, ctx, "bare", &metav1.OwnerReference{APIVersion: "batch/v1", Kind: "Job",
		Name: env.job, UID: env.jobUID, Controller: ptr.To(true)})
	pod.Labels = map[string]string{"kueue.x-k8s.io/podset": "main"}
	env.expectPodRefused(t, ctx, pod)
}

// attackPricingCache: a class that spans kinds, asked for with a selector
// that keeps only 1g MIG devices (4 of them: 4/7 of a unit, which fits),
// dry-run; then the same class with one selector whose CEL comment holds
// the separator and the text of the first claim's second selector: it
// matches every device, so 4 whole GPUs, which do not fit.
func attackPricingCache(t *testing.T, ctx context.Context, env *redTeamEnv) {
	const mig1g = `device.attributes["gpu.gpuaas.io"].profile == "1g.10gb"`
	primer := gpuClaim(env.ns, "primer", env.spanning, 4)
	primer.Spec.Devices.Requests[0].Exactly.Selectors = celSelectors("true // x", mig1g)
	if _, err := env.claims().Create(ctx, primer, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
		t.Fatalf("dry run of 4 MIG 1g devices, which fit: %v", err)
	}
	target := gpuClaim(env.ns, "target", env.spanning, 4)
	target.Spec.Devices.Requests[0].Exactly.Selectors = celSelectors("true // x\x00" + mig1g)
	_, err := env.claims().Create(ctx, target, metav1.CreateOptions{})
	refused(t, err, `TenantQuota "`+env.tenant+`" exceeded`, "requested 4,")
}

func attackForgedWorkload(t *testing.T, ctx context.Context, env *redTeamEnv) {
	workloads := env.attackerDyn.Resource(framework.KueueResource("workloads")).Namespace(env.ns)
	forged := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
		"metadata": map[string]any{"name": "forged", "namespace": env.ns},
		"spec": map[string]any{"queueName": "queue", "podSets": []any{map[string]any{
			"name": "main", "count": int64(1),
			"template": map[string]any{"spec": map[string]any{"containers": []any{map[string]any{"name": "c", "image": "x"}}}},
		}}},
	}}
	if _, err := workloads.Create(ctx, forged, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the tenant creating a Workload: %v, want forbidden", err)
	}
	list, err := cp.Dynamic.Resource(framework.KueueResource("workloads")).Namespace(env.ns).List(ctx, metav1.ListOptions{})
	if err != nil || len(list.Items) != 1 {
		t.Fatalf("the Job's Workload: %v, %d found", err, len(list.Items))
	}
	wl := &list.Items[0]
	psas, _, _ := unstructured.NestedSlice(wl.Object, "status", "admission", "podSetAssignments")
	for _, p := range psas {
		_ = unstructured.SetNestedField(p.(map[string]any), "17000", "resourceUsage", kueue.DefaultResource)
	}
	_ = unstructured.SetNestedSlice(wl.Object, psas, "status", "admission", "podSetAssignments")
	if _, err := workloads.UpdateStatus(ctx, wl, metav1.UpdateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the tenant raising its Workload's charge: %v, want forbidden", err)
	}
}

func attackKueueLabels(t *testing.T, ctx context.Context, env *redTeamEnv) {
	wl, err := cp.Dynamic.Resource(framework.KueueResource("workloads")).Namespace(env.ns).List(ctx, metav1.ListOptions{})
	if err != nil || len(wl.Items) != 1 {
		t.Fatalf("the Job's Workload: %v", err)
	}
	pod := env.templatePod(t, ctx, "labelled", nil)
	pod.Labels = map[string]string{"kueue.x-k8s.io/podset": "main", "kueue.x-k8s.io/pod-group-name": wl.Items[0].GetName(),
		"kueue.x-k8s.io/prebuilt-workload-name": wl.Items[0].GetName()}
	env.expectPodRefused(t, ctx, pod)
}

func attackPodUnderJobPod(t *testing.T, ctx context.Context, env *redTeamEnv) {
	pod := env.templatePod(t, ctx, "underling", &metav1.OwnerReference{APIVersion: "v1", Kind: "Pod",
		Name: env.jobPod.Name, UID: env.jobPod.UID, Controller: ptr.To(true)})
	pod.Labels = map[string]string{"kueue.x-k8s.io/podset": "main"}
	env.expectPodRefused(t, ctx, pod, "not admitted for Kueue: over what Kueue charged")
}

func attackGrowClaim(t *testing.T, ctx context.Context, env *redTeamEnv) {
	small, err := env.claims().Create(ctx, gpuClaim(env.ns, "small", "gpu.gpuaas.io", 1), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("a claim within the limit: %v", err)
	}
	small.Spec.Devices.Requests[0].Exactly.Count = 4
	if _, err := env.claims().Update(ctx, small, metav1.UpdateOptions{}); err == nil {
		t.Error("a claim's device count was raised after admission")
	}
}

func attackClusterScoped(t *testing.T, ctx context.Context, env *redTeamEnv) {
	patch := []byte(`{"metadata":{"labels":{"` + gpuaas.QuotaExemptLabel + `":"true"}}}`)
	_, err := env.attacker.Client.CoreV1().Namespaces().Patch(ctx, env.ns, types.MergePatchType, patch, metav1.PatchOptions{})
	if !apierrors.IsForbidden(err) {
		t.Errorf("the tenant exempting its own namespace: %v, want forbidden", err)
	}
	dc := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: uniqueName("tenant-class")}}
	if _, err := env.attacker.Client.ResourceV1().DeviceClasses().Create(ctx, dc, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the tenant writing the catalog: %v, want forbidden", err)
	}
	quotas := env.attackerDyn.Resource(gpuaas.GroupVersion.WithResource("tenantquotas"))
	raise := []byte(`{"spec":{"limits":{"gpuUnits":"17"}}}`)
	if _, err := quotas.Patch(ctx, env.tenant, types.MergePatchType, raise, metav1.PatchOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the tenant raising its own TenantQuota: %v, want forbidden", err)
	}
}

// templatePod is a pod of the attacker's asking for two whole GPUs from a
// template of its own, controlled by owner (if any).
func attackLockLenderOut(t *testing.T, ctx context.Context, env *redTeamEnv) {
	env.allowBorrowing(t, ctx)
	// The hogs are standalone claims (no pod's template made them), which
	// a lender reclaims only from a tenant opted in (issue 55 route 7).
	env.changeQuota(t, ctx, func(q *gpuaas.TenantQuota) { q.Spec.ReclaimStandaloneClaims = true })
	// Its own second unit, then the peer's idle one, then more: bare
	// claims no pod uses.
	var hogs []*resourceapi.ResourceClaim
	for i := range 4 {
		c, err := env.claims().Create(ctx, gpuClaim(env.ns, fmt.Sprintf("hog-%d", i), "gpu.gpuaas.io", 1), metav1.CreateOptions{})
		if err == nil {
			hogs = append(hogs, c)
		}
	}
	if len(hogs) != 2 {
		t.Fatalf("the tenant got %v; want its own unit and the peer's idle one", hogs)
	}
	// The peer asks for its own unit: lent out at first, reclaimed from
	// the hogs once they have stayed unallocated past the grace.
	peerClaim := gpuClaim(env.peerNS, uniqueName("lender"), "gpu.gpuaas.io", 1)
	var last error
	err := wait.PollUntilContextTimeout(ctx, time.Second, time.Minute, true, func(ctx context.Context) (bool, error) {
		err := createClaim(ctx, peerClaim)
		if err != nil && ctx.Err() == nil {
			last = err // the API's answer, not the poll's deadline
		}
		if err != nil && !strings.Contains(err.Error(), "has lent it out") {
			return false, err
		}
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("the peer stayed locked out of its own quota: %v (last: %v)", err, last)
	}
	// It owed one unit: one of the two is taken, by the reclaim's rule.
	if taken, kept := reclaimedNewestFirst(t, ctx, hogs); len(taken) != 1 {
		t.Fatalf("the reclaim took %v and left %v, want one: the tenant owed one unit", taken, kept)
	}
	// The peer's unit is back in use: give it back, so the containment
	// check's peer claim (within the peer's limit of 1) can be admitted.
	if err := cp.Client.ResourceV1().ResourceClaims(env.peerNS).Delete(ctx, peerClaim.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
}

func attackRerunCreate(t *testing.T, ctx context.Context, env *redTeamEnv) {
	env.allowBorrowing(t, ctx)
	dup := gpuClaim(env.ns, "dup", "gpu.gpuaas.io", 1)
	if _, err := env.claims().Create(ctx, dup, metav1.CreateOptions{}); err != nil {
		t.Fatalf("the tenant's own second unit: %v", err)
	}
	for range 20 {
		_, err := env.claims().Create(ctx, gpuClaim(env.ns, "dup", "gpu.gpuaas.io", 1), metav1.CreateOptions{})
		if !apierrors.IsAlreadyExists(err) && !apierrors.IsForbidden(err) {
			t.Fatalf("re-running the create: got %v, want AlreadyExists (or a quota refusal)", err)
		}
	}
	// checkContained's peer claim, right away, within 35 s of the re-runs.
}

// allowBorrowing is the platform letting the tenant borrow from its
// cohort (the admin's change, not the attacker's).
func (env *redTeamEnv) allowBorrowing(t *testing.T, ctx context.Context) {
	t.Helper()
	env.changeQuota(t, ctx, func(q *gpuaas.TenantQuota) { q.Spec.BorrowingLimit = nil })
}

// changeQuota is the platform changing the tenant's TenantQuota; it
// returns once the controller has read the change.
func (env *redTeamEnv) changeQuota(t *testing.T, ctx context.Context, change func(*gpuaas.TenantQuota)) {
	t.Helper()
	q := &gpuaas.TenantQuota{ObjectMeta: metav1.ObjectMeta{Name: env.tenant}}
	updateObject(t, ctx, q, change)
	// The controller has read the change once its status describes it.
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		var got gpuaas.TenantQuota
		if err := ctrlClient.Get(ctx, client.ObjectKey{Name: env.tenant}, &got); err != nil {
			return false, err
		}
		return got.Status.ObservedGeneration >= q.Generation, nil
	})
	if err != nil {
		t.Fatalf("the controller did not take up TenantQuota %s's change: %v", env.tenant, err)
	}
}

func (env *redTeamEnv) templatePod(t *testing.T, ctx context.Context, name string, owner *metav1.OwnerReference) *v1.Pod {
	t.Helper()
	tmpl := &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: env.ns},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: gpuClaim(env.ns, "", "gpu.gpuaas.io", 2).Spec}}
	if _, err := env.attacker.Client.ResourceV1().ResourceClaimTemplates(env.ns).Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := claimPod(env.ns, name, "", name)
	if owner != nil {
		pod.OwnerReferences = []metav1.OwnerReference{*owner}
	}
	return pod
}

// expectPodRefused creates the pod as the attacker and waits for the
// webhook to refuse the claim the kube-controller-manager makes for it.
func (env *redTeamEnv) expectPodRefused(t *testing.T, ctx context.Context, pod *v1.Pod, why ...string) {
	t.Helper()
	if _, err := env.attacker.Client.CoreV1().Pods(env.ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	ev, err := cp.WaitForEvent(wctx, env.ns, "Pod", pod.Name, "QuotaExceeded", append([]string{`TenantQuota "` + env.tenant + `" exceeded`}, why...)...)
	if err != nil {
		t.Errorf("the claim of pod %s was not refused: %v", pod.Name, err)
		return
	}
	t.Logf("refused as expected: %s", ev.Message)
}

// refused expects the webhook to have refused err's request with a message
// containing every part. Unlike mustDeny it lets the test go on, so the
// containment checks report what an admitted attack got.
func refused(t *testing.T, err error, parts ...string) {
	t.Helper()
	if err == nil {
		t.Errorf("created, want a denial containing %q", parts)
		return
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Errorf("denial %q lacks %q", err.Error(), p)
			return
		}
	}
	t.Logf("refused as expected: %v", err)
}

func celSelectors(exprs ...string) []resourceapi.DeviceSelector {
	out := make([]resourceapi.DeviceSelector, len(exprs))
	for i, e := range exprs {
		out[i] = resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{Expression: e}}
	}
	return out
}
