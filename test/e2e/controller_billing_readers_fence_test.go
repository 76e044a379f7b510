package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller/billingreaders"
	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

// TestChartFencesTheBillingReadersWrites (issue 58, item 4): with the
// chart's RBAC and admission policies on the real API server, the
// billing readers' reconciler, as the controller's own ServiceAccount,
// makes, puts back and deletes a tenant's reader role and binding; the same
// account is refused a role of any other rule, a write to a ClusterRole it
// did not make, and a binding of any other role. The API server
// type-checks the policy without warnings.
func TestChartFencesTheBillingReadersWrites(t *testing.T) {
	installCRDs(t)
	ctx := framework.Context(t, 2*time.Minute)
	release := uniqueName("fence")
	ns := cp.CreateNamespace(t, "readers-fence")
	sa, policy, bindingPolicy := installControllerRBAC(t, release, ns)
	as := impersonate(t, ns, sa)
	tenant := uniqueName("fenced")
	q := quotaFor(tenant, []string{ns}, gpuaas.QuotaLimits{})
	q.Spec.Billing = &gpuaas.TenantBilling{Readers: []rbacv1.Subject{{Kind: rbacv1.UserKind, Name: "finance@" + tenant}}}
	createObject(t, q)
	name := billingreaders.Name(tenant)
	t.Cleanup(func() { deleteReaderObjects(name, "gpuaas-billing-reader-"+tenant+"-x") })

	// Refused, once the policy is active: a labelled role of another rule.
	wide := readerRoleOf(t, tenant, "gpuaas-billing-reader-"+tenant+"-x", "get", "list")
	waitRefused(t, ctx, policy, func() error { return as.Create(ctx, wide.DeepCopy()) },
		func() { _ = cp.Client.RbacV1().ClusterRoles().Delete(ctx, wide.Name, metav1.DeleteOptions{}) })

	// The reconciler as the controller's account: allowed.
	r := &billingreaders.Reconciler{Client: as, Now: time.Now}
	reconcileAs := func() error {
		_, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: types.NamespacedName{Name: tenant}})
		return err
	}
	waitReadable(t, ctx, "the reconciler's writes as the controller's account", reconcileAs)
	patch := []byte(`{"rules":[{"apiGroups":["*"],"resources":["*"],"verbs":["*"]}]}`)
	if _, err := cp.Client.RbacV1().ClusterRoles().Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := reconcileAs(); err != nil {
		t.Errorf("putting back a hand-widened role as the controller's account: %v", err)
	}
	if role, err := cp.Client.RbacV1().ClusterRoles().Get(ctx, name, metav1.GetOptions{}); err != nil ||
		len(role.Rules) != 1 || strings.Join(role.Rules[0].Verbs, ",") != "get" {
		t.Errorf("the role after the put-back: %v (%v)", role, err)
	}

	// Refused: taking over an admin's role, binding another role.
	foreign := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "gpuaas-billing-reader-" + tenant + "-x"}}
	if _, err := cp.Client.RbacV1().ClusterRoles().Create(ctx, foreign, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	taken := readerRoleOf(t, tenant, foreign.Name, "get")
	mustRefuse(t, policy, "relabelling an admin's ClusterRole", as.Update(ctx, withVersion(t, ctx, taken)))
	mustRefuse(t, policy, "deleting an admin's ClusterRole", as.Delete(ctx, foreign.DeepCopy()))
	b := &rbacv1.ClusterRoleBinding{ObjectMeta: readerMeta(t, tenant, "gpuaas-billing-reader-"+tenant+"-x"),
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "view"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "mallory"}}}
	// RBAC refuses a wider role before the policy is asked; the policy
	// refuses binding even a reader role under another binding's name.
	if err := as.Create(ctx, b.DeepCopy()); !apierrors.IsForbidden(err) {
		t.Errorf("binding the view role as the controller's account: %v, want Forbidden", err)
	}
	b.RoleRef.Name = name
	mustRefuse(t, bindingPolicy, "binding a reader role by another name", as.Create(ctx, b))

	// The readers removed: the reconciler deletes both, as the account.
	onConflictRetry(t, "removing the readers", func() error {
		var have gpuaas.TenantQuota
		if err := ctrlClient.Get(ctx, types.NamespacedName{Name: tenant}, &have); err != nil {
			return err
		}
		have.Spec.Billing = nil
		return ctrlClient.Update(ctx, &have)
	})
	if err := reconcileAs(); err != nil {
		t.Errorf("deleting the reader objects as the controller's account: %v", err)
	}
	if _, err := cp.Client.RbacV1().ClusterRoles().Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the role after the readers were removed: %v, want not found", err)
	}
	checkPolicyTypeChecked(t, ctx, policy)
	checkPolicyTypeChecked(t, ctx, bindingPolicy)
}

// installControllerRBAC applies the chart's accounts, RBAC and admission
// policies, and says the controller's account and the readers' policies.
func installControllerRBAC(t *testing.T, release, ns string) (sa, roles, bindings string) {
	t.Helper()
	ctx := framework.Context(t, time.Minute)
	_, objs := renderChart(t, release, ns)
	for _, o := range objs {
		switch o.GetKind() {
		case "Deployment":
			if strings.HasSuffix(o.GetName(), "-controller") {
				var dep appsv1.Deployment
				fromUnstructured(t, o, &dep)
				sa = dep.Spec.Template.Spec.ServiceAccountName
			}
		case "ValidatingAdmissionPolicy":
			if strings.HasSuffix(o.GetName(), "-billing-reader-roles") {
				roles = o.GetName()
			}
			if strings.HasSuffix(o.GetName(), "-billing-reader-bindings") {
				bindings = o.GetName()
			}
		}
		if !slices.Contains([]string{"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}, o.GetKind()) {
			continue
		}
		if _, err := cp.ApplyObject(ctx, o, ns); err != nil {
			t.Fatal(err)
		}
		if o.GetNamespace() == "" && o.GetKind() != "ServiceAccount" {
			deleteClusterObjectAtCleanup(t, o)
		}
	}
	if sa == "" || roles == "" || bindings == "" {
		t.Fatalf("the rendered chart lacks the controller's account (%q) or the billing readers' policies (%q, %q)", sa, roles, bindings)
	}
	return sa, roles, bindings
}

func impersonate(t *testing.T, ns, sa string) client.Client {
	t.Helper()
	cfg := rest.CopyConfig(cp.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: fmt.Sprintf("system:serviceaccount:%s:%s", ns, sa),
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"}}
	scheme, err := controller.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func readerMeta(t *testing.T, tenant, name string) metav1.ObjectMeta {
	t.Helper()
	var q gpuaas.TenantQuota
	if err := ctrlClient.Get(context.Background(), types.NamespacedName{Name: tenant}, &q); err != nil {
		t.Fatal(err)
	}
	return metav1.ObjectMeta{Name: name, Labels: map[string]string{billingreaders.Label: "true"},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: gpuaas.GroupVersion.String(), Kind: gpuaas.TenantQuotaKind,
			Name: q.Name, UID: q.UID, Controller: ptrTo(true)}}}
}

func readerRoleOf(t *testing.T, tenant, name string, verbs ...string) *rbacv1.ClusterRole {
	t.Helper()
	return &rbacv1.ClusterRole{ObjectMeta: readerMeta(t, tenant, name),
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"gpuaas.io"}, Resources: []string{"tenantusages"}, Verbs: verbs,
			ResourceNames: []string{tenant + "-2026-12"}}}}
}

func withVersion(t *testing.T, ctx context.Context, role *rbacv1.ClusterRole) *rbacv1.ClusterRole {
	t.Helper()
	have, err := cp.Client.RbacV1().ClusterRoles().Get(ctx, role.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	role.ResourceVersion = have.ResourceVersion
	return role
}

// waitRefused waits until write is refused by the policy (policies take
// effect a moment after they are made); undo removes what got through.
func waitRefused(t *testing.T, ctx context.Context, policy string, write func() error, undo func()) {
	t.Helper()
	var last error
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		if last = write(); last == nil {
			undo()
		}
		return last != nil && strings.Contains(last.Error(), policy), nil
	})
	if err != nil {
		t.Fatalf("never refused by %s: %v (last: %v)", policy, err, last)
	}
}

func mustRefuse(t *testing.T, policy, what string, err error) {
	t.Helper()
	if err == nil || !strings.Contains(err.Error(), policy) {
		t.Errorf("%s as the controller's account: %v, want refused by %s", what, err, policy)
	}
}

func checkPolicyTypeChecked(t *testing.T, ctx context.Context, policy string) {
	t.Helper()
	policies := cp.Client.AdmissionregistrationV1().ValidatingAdmissionPolicies()
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := policies.Get(ctx, policy, metav1.GetOptions{})
		if err != nil || p.Status.ObservedGeneration != p.Generation || p.Status.TypeChecking == nil {
			return false, nil
		}
		for _, w := range p.Status.TypeChecking.ExpressionWarnings {
			t.Errorf("policy %s: %s: %s", policy, w.FieldRef, w.Warning)
		}
		return true, nil
	})
	if err != nil {
		t.Errorf("policy %s was never type-checked: %v", policy, err)
	}
}

func deleteReaderObjects(names ...string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, n := range names {
		_ = cp.Client.RbacV1().ClusterRoleBindings().Delete(ctx, n, metav1.DeleteOptions{})
		_ = cp.Client.RbacV1().ClusterRoles().Delete(ctx, n, metav1.DeleteOptions{})
	}
}
