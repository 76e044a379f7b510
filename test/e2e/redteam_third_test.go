package e2e

import (
	"context"
	"fmt"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// The third red team's routes (issue 55) that need Kueue.

// attackOverruledClaimNamesAnotherPod (route 6): with its own limit at 0,
// the tenant's Job gets its GPU only because Kueue admitted it. The tenant
// points the claim's controller ownerReference at a never-ending pod of its
// own (no GPU, no queue) and deletes the Job: the kube-controller-manager
// no longer deletes the claim, and the overrule sweep, which asked the
// claim's current owner whether it runs, kept it for as long as that pod
// did. Only the pod the gate verified (by UID) keeps it: it is deleted.
func attackOverruledClaimNamesAnotherPod(t *testing.T, ctx context.Context, env *redTeamEnv) {
	claim := env.overruleSecondJob(t, ctx)
	forever := env.foreverPod(t, ctx, "forever")
	owner := fmt.Sprintf(`{"metadata":{"ownerReferences":[{"apiVersion":"v1","kind":"Pod","name":%q,"uid":%q,"controller":true}]}}`,
		forever.Name, forever.UID)
	if err := env.orphanClaimOfSecondJob(t, ctx, claim, []byte(owner)); err != nil {
		t.Errorf("claim %s, admitted past the quota for a Job the tenant deleted, outlived it by naming pod %s: %v", claim, forever.Name, err)
	}
	if p, err := env.attacker.Client.CoreV1().Pods(env.ns).Get(ctx, forever.Name, metav1.GetOptions{}); err != nil || p.Status.Phase != v1.PodRunning {
		t.Errorf("the tenant's pod %s no longer runs (%v): the sweep was not put to the test", forever.Name, err)
	}
}

// podOfJobWithClaim waits for the Job's one pod with its claim made.
func (env *redTeamEnv) podOfJobWithClaim(t *testing.T, ctx context.Context, job string) *v1.Pod {
	t.Helper()
	kq := &kueueHelper{t: t}
	var pod *v1.Pod
	kq.poll(ctx, "the claim of Job "+job, func(ctx context.Context) (bool, error) {
		pods := kq.jobPods(ctx, env.ns, job)
		if len(pods) == 1 && len(pods[0].Status.ResourceClaimStatuses) == 1 && pods[0].Status.ResourceClaimStatuses[0].ResourceClaimName != nil {
			pod = &pods[0]
		}
		return pod != nil, nil
	})
	return pod
}

// foreverPod is a pod of the tenant's, as its ServiceAccount, that holds no
// device, is in no queue and never ends; it waits until the pod runs.
func (env *redTeamEnv) foreverPod(t *testing.T, ctx context.Context, name string) *v1.Pod {
	t.Helper()
	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: env.ns},
		Spec: v1.PodSpec{
			Containers:                    []v1.Container{{Name: "ctr", Image: "registry.k8s.io/pause:3.10"}},
			TerminationGracePeriodSeconds: ptr.To[int64](0),
		},
	}
	pods := env.attacker.Client.CoreV1().Pods(env.ns)
	if _, err := pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("the tenant's own pod: %v", err)
	}
	kq := &kueueHelper{t: t}
	kq.poll(ctx, "the tenant's pod "+name+" running", func(ctx context.Context) (bool, error) {
		var err error
		pod, err = pods.Get(ctx, name, metav1.GetOptions{})
		return err == nil && pod.Status.Phase == v1.PodRunning, err
	})
	return pod
}
