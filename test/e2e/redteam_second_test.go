package e2e

import (
	"context"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
)

// The second red team's routes (issue 36): usage Kueue does not see (bare
// claims) and usage it admitted add up against one TenantQuota; a claim
// admitted past the quota for a workload ends with the workload; a re-run
// create holds no peer's quota.

// attackBareThenKueueJob (route 1): the tenant's bare claims take its whole
// limit, which Kueue never sees; its queue is empty, so Kueue admits a Job.
// Before the fix the Job's claim was overruled on top of the bare ones: 3
// GPUs on a limit of 2.
func attackBareThenKueueJob(t *testing.T, ctx context.Context, env *redTeamEnv) {
	kq := &kueueHelper{t: t}
	env.endJob(t, ctx, env.job)
	for _, name := range []string{"bare-0", "bare-1"} {
		if _, err := env.claims().Create(ctx, gpuClaim(env.ns, name, "gpu.gpuaas.io", 1), metav1.CreateOptions{}); err != nil {
			t.Fatalf("bare claim %s within the limit: %v", name, err)
		}
	}
	kq.job(ctx, env.ns, "second", jobSpec{class: "gpu.gpuaas.io"})
	if got := kq.waitAdmitted(ctx, env.ns, "second"); got != 1000 {
		t.Fatalf("Kueue charged the second Job %d milli-units, want 1000", got)
	}
	pod := env.podOfJob(t, ctx, "second")
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	ev, err := cp.WaitForEvent(wctx, env.ns, "Pod", pod.Name, "QuotaExceeded",
		`TenantQuota "`+env.tenant+`" exceeded`, "Kueue charged the active workloads")
	if err != nil {
		t.Errorf("the Job's claim was not refused: %v", err)
		return
	}
	t.Logf("refused as expected: %s", ev.Message)
}

// attackOverruledClaimOutlivesJob (route 2): with its own limit at 0, the
// tenant's Job gets its GPU only because Kueue admitted it. The tenant
// removes the claim's ownerReference and deletes the Job: the
// kube-controller-manager no longer deletes the claim, which the tenant
// could use from bare pods for ever. The controller deletes it.
func attackOverruledClaimOutlivesJob(t *testing.T, ctx context.Context, env *redTeamEnv) {
	claim := env.overruleSecondJob(t, ctx)
	if err := env.orphanClaimOfSecondJob(t, ctx, claim, []byte(`{"metadata":{"ownerReferences":null}}`)); err != nil {
		t.Errorf("claim %s, admitted past the quota for a Job the tenant deleted, still exists: %v", claim, err)
	}
}

// overruleSecondJob ends the env's Job, sets the tenant's limit to 0 and
// has Kueue admit a Job "second" past it; it returns the claim of its pod.
func (env *redTeamEnv) overruleSecondJob(t *testing.T, ctx context.Context) string {
	t.Helper()
	kq := &kueueHelper{t: t}
	env.endJob(t, ctx, env.job)
	env.changeQuota(t, ctx, func(q *gpuaas.TenantQuota) { q.Spec.Limits.GpuUnits = units("0") })
	kq.job(ctx, env.ns, "second", jobSpec{class: "gpu.gpuaas.io"})
	kq.waitAdmitted(ctx, env.ns, "second")
	return *env.podOfJobWithClaim(t, ctx, "second").Status.ResourceClaimStatuses[0].ResourceClaimName
}

// orphanClaimOfSecondJob patches the claim with patch and deletes the Job
// "second", both as the tenant, and waits (2 minutes: the overrule sweep
// runs every 30 s) for the controller to delete the claim.
func (env *redTeamEnv) orphanClaimOfSecondJob(t *testing.T, ctx context.Context, claim string, patch []byte) error {
	t.Helper()
	if _, err := env.claims().Patch(ctx, claim, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatalf("the tenant patching its claim's ownerReferences: %v", err)
	}
	err := env.attacker.Client.BatchV1().Jobs(env.ns).Delete(ctx, "second", metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)})
	if err != nil {
		t.Fatal(err)
	}
	return wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := env.claims().Get(ctx, claim, metav1.GetOptions{})
		return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
	})
}

// attackDearerRerun (route 3): the tenant holds claim "own" (one GPU) and
// re-runs its create with two, admitted by borrowing its peer's idle unit;
// the API server then answers AlreadyExists. The reservation of that
// nothing refused the peer its own quota for 35 s (checkContained's peer
// claim follows at once).
func attackDearerRerun(t *testing.T, ctx context.Context, env *redTeamEnv) {
	env.endJob(t, ctx, env.job)
	env.allowBorrowing(t, ctx)
	if _, err := env.claims().Create(ctx, gpuClaim(env.ns, "own", "gpu.gpuaas.io", 1), metav1.CreateOptions{}); err != nil {
		t.Fatalf("the tenant's own unit: %v", err)
	}
	_, err := env.claims().Create(ctx, gpuClaim(env.ns, "own", "gpu.gpuaas.io", 2), metav1.CreateOptions{})
	if !apierrors.IsAlreadyExists(err) {
		t.Fatalf("re-running the create with two GPUs: got %v, want AlreadyExists", err)
	}
}

// endJob deletes one of the tenant's Jobs, as the tenant, and waits until
// its claims are gone.
func (env *redTeamEnv) endJob(t *testing.T, ctx context.Context, job string) {
	t.Helper()
	kq := &kueueHelper{t: t}
	err := env.attacker.Client.BatchV1().Jobs(env.ns).Delete(ctx, job, metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)})
	if err != nil {
		t.Fatalf("deleting Job %s: %v", job, err)
	}
	kq.poll(ctx, "the claims of Job "+job+" gone", func(ctx context.Context) (bool, error) {
		claims, err := env.claims().List(ctx, metav1.ListOptions{})
		return err == nil && len(claims.Items) == 0, err
	})
}

// podOfJob waits for the Job's one pod.
func (env *redTeamEnv) podOfJob(t *testing.T, ctx context.Context, job string) *v1.Pod {
	t.Helper()
	kq := &kueueHelper{t: t}
	var pod *v1.Pod
	kq.poll(ctx, "the pod of Job "+job, func(ctx context.Context) (bool, error) {
		pods := kq.jobPods(ctx, env.ns, job)
		if len(pods) == 1 {
			pod = &pods[0]
		}
		return pod != nil, nil
	})
	return pod
}
