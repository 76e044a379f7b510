package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

// testKueueControllerWorkloadFence: the chart's controller may patch any
// Kueue Workload as far as RBAC goes (the idle policy's Deactivate); the
// chart's policy lets its ServiceAccount only set spec.active=false, so it
// can neither relabel a tenant's Workload nor reactivate one a person
// deactivated. Acted as the controller's ServiceAccount (impersonation), on
// a real Kueue's Workload.
func testKueueControllerWorkloadFence(t *testing.T, kq *kueueHelper) {
	helmBin(t) // one skip line when helm is not built
	ctx := framework.Context(t, 3*time.Minute)
	ns := kq.team("wl-fence", "", 1000, nil)
	kq.job(ctx, ns, "fenced", jobSpec{class: "gpu.gpuaas.io"})
	kq.waitAdmitted(ctx, ns, "fenced")
	wl, err := kq.workload(ctx, ns, "fenced")
	if err != nil || wl == nil {
		t.Fatalf("the Job's Workload: %v", err)
	}
	sa := applyChartAccess(t, "wlfence", ns, "-controller", "--set", "controller.kueue=true", "--set", "controller.idlePolicy=true")
	cfg := rest.CopyConfig(cp.Config)
	cfg.Impersonate = rest.ImpersonationConfig{
		UserName: fmt.Sprintf("system:serviceaccount:%s:%s", ns, sa),
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
	}
	workloads := dynamic.NewForConfigOrDie(cfg).Resource(framework.KueueResource("workloads")).Namespace(ns)
	patch := func(doc string) error {
		_, err := workloads.Patch(ctx, wl.GetName(), types.MergePatchType, []byte(doc), metav1.PatchOptions{})
		return err
	}

	// Once the policy is active, a label is refused.
	var refusal error
	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		refusal = patch(`{"metadata":{"labels":{"taken":"over"}}}`)
		return refusal != nil && strings.Contains(refusal.Error(), "ValidatingAdmissionPolicy"), nil
	})
	if err != nil || !apierrors.IsForbidden(refusal) || !strings.Contains(refusal.Error(), "may only deactivate Kueue Workloads") {
		t.Fatalf("the controller labelling a Workload: want Forbidden by the policy, got %v (%v)", refusal, err)
	}
	if err := patch(`{"spec":{"active":false}}`); err != nil {
		t.Fatalf("the controller deactivating a Workload (the idle policy's Deactivate): %v", err)
	}
	if err := patch(`{"spec":{"active":true}}`); !apierrors.IsForbidden(err) {
		t.Fatalf("the controller reactivating a Workload: want Forbidden, got %v", err)
	}
	t.Logf("as %s: labelling refused (%v), deactivating allowed, reactivating refused", sa, refusal)
}
