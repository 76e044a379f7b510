package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller/billing"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller/billingreaders"
	"github.com/gpuaas/gpu-dra-driver/pkg/statement"
	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

// TestControllerBillingReadersReadOnlyTheirTenant (issue 58, item 4): a
// tenant's namespace admin, as its own ServiceAccount, reads nothing of
// billing until the platform admin lists it in the tenant's
// spec.billing.readers; then the statement's read gets its tenant's
// TenantUsages (this month's and an older one) and is Forbidden on another
// tenant's and on listing them; a hand-widened role is put back; removing
// the readers takes the access away, and so does deleting the TenantQuota.
func TestControllerBillingReadersReadOnlyTheirTenant(t *testing.T) {
	rc := startController(t)
	ctx := framework.Context(t, 3*time.Minute)
	name := uniqueName("readers")
	tenantA, tenantB := name+"-a", name+"-b"
	ns := cp.CreateNamespace(t, "readers")
	admin, err := cp.NewTenant(ctx, ns, "finance")
	if err != nil {
		t.Fatal(err)
	}
	scheme, err := controller.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	as, err := client.New(admin.Config, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	period, _, _ := billing.Period(time.Now())
	for _, u := range []*gpuaas.TenantUsage{tenantUsage(tenantA, period), tenantUsage(tenantA, "2025-01"), tenantUsage(tenantB, period)} {
		createObject(t, u)
	}
	read := func(tenant, period string) error { _, err := statement.Read(ctx, as, tenant, period); return err }
	if err := read(tenantA, period); !apierrors.IsForbidden(err) {
		t.Fatalf("the namespace admin reading its tenant's usage before it is a reader: %v, want Forbidden", err)
	}

	// A ServiceAccount reader without its namespace would make a binding
	// the API server refuses: the quota is refused instead.
	bad := quotaFor(tenantA, []string{ns}, gpuaas.QuotaLimits{})
	bad.Spec.Billing = &gpuaas.TenantBilling{Readers: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "finance"}}}
	if err := ctrlClient.Create(ctx, bad); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "names its namespace") {
		t.Fatalf("a quota with a ServiceAccount reader without namespace: %v, want Invalid", err)
	}
	q := quotaFor(tenantA, []string{ns}, gpuaas.QuotaLimits{})
	q.Spec.Billing = &gpuaas.TenantBilling{Readers: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: "finance"}}}
	createObject(t, q)
	waitReadable(t, ctx, "the reader's own tenant's usage", func() error { return read(tenantA, period) })
	if err := read(tenantA, "2025-01"); err != nil {
		t.Errorf("the reader reading its tenant's older usage: %v", err)
	}
	if err := read(tenantB, period); !apierrors.IsForbidden(err) {
		t.Errorf("the reader of %s reading %s's usage: %v, want Forbidden", tenantA, tenantB, err)
	}
	if err := read("", period); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "pass --tenant") {
		t.Errorf("the reader listing TenantUsages: %v, want Forbidden, naming --tenant", err)
	}

	// An admin's hand edit widening the role is put back.
	role := billingreaders.Name(tenantA)
	patch := []byte(`{"rules":[{"apiGroups":["gpuaas.io"],"resources":["tenantusages"],"verbs":["get","list"]}]}`)
	if _, err := cp.Client.RbacV1().ClusterRoles().Patch(ctx, role, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatalf("widening the role by hand: %v", err)
	}
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		r, err := cp.Client.RbacV1().ClusterRoles().Get(ctx, role, metav1.GetOptions{})
		return err == nil && len(r.Rules) == 1 && strings.Join(r.Rules[0].Verbs, ",") == "get" && len(r.Rules[0].ResourceNames) == 2, nil
	})
	if err != nil {
		t.Errorf("the hand-widened role was not put back: %v", err)
	}

	// The readers removed: the access goes with its role and binding.
	onConflictRetry(t, "removing the readers", func() error {
		var have gpuaas.TenantQuota
		if err := ctrlClient.Get(ctx, types.NamespacedName{Name: tenantA}, &have); err != nil {
			return err
		}
		have.Spec.Billing = nil
		return ctrlClient.Update(ctx, &have)
	})
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, errRole := cp.Client.RbacV1().ClusterRoles().Get(ctx, role, metav1.GetOptions{})
		_, errBinding := cp.Client.RbacV1().ClusterRoleBindings().Get(ctx, role, metav1.GetOptions{})
		return apierrors.IsNotFound(errRole) && apierrors.IsNotFound(errBinding) && apierrors.IsForbidden(read(tenantA, period)), nil
	})
	if err != nil {
		t.Errorf("the readers removed, the role, binding or access stayed: %v (read: %v)", err, read(tenantA, period))
	}

	// The readers again, then the TenantQuota deleted: its role and
	// binding are the garbage collector's, through their owner reference.
	updateObject(t, ctx, &gpuaas.TenantQuota{ObjectMeta: metav1.ObjectMeta{Name: tenantA}}, func(q *gpuaas.TenantQuota) {
		q.Spec.Billing = &gpuaas.TenantBilling{Readers: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: "finance"}}}
	})
	waitReadable(t, ctx, "the reader's usage, the readers set again", func() error { return read(tenantA, period) })
	if err := ctrlClient.Delete(ctx, &gpuaas.TenantQuota{ObjectMeta: metav1.ObjectMeta{Name: tenantA}}); err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, errRole := cp.Client.RbacV1().ClusterRoles().Get(ctx, role, metav1.GetOptions{})
		_, errBinding := cp.Client.RbacV1().ClusterRoleBindings().Get(ctx, role, metav1.GetOptions{})
		return apierrors.IsNotFound(errRole) && apierrors.IsNotFound(errBinding) && apierrors.IsForbidden(read(tenantA, period)), nil
	})
	if err != nil {
		t.Errorf("the TenantQuota deleted, its readers' role, binding or access stayed: %v (read: %v)", err, read(tenantA, period))
	}
	rc.alive(t)
}

func tenantUsage(tenant, period string) *gpuaas.TenantUsage {
	start, _ := time.Parse("2006-01", period)
	return &gpuaas.TenantUsage{ObjectMeta: metav1.ObjectMeta{Name: billing.UsageName(tenant, period)},
		Spec: gpuaas.TenantUsageSpec{Tenant: tenant, Period: period, Start: metav1.NewTime(start), End: metav1.NewTime(start.AddDate(0, 1, 0))}}
}

// waitReadable waits until read succeeds: the RBAC authorizer learns of
// the controller's binding from an informer.
func waitReadable(t *testing.T, ctx context.Context, what string, read func() error) {
	t.Helper()
	var last error
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		last = read()
		return last == nil, nil
	})
	if err != nil {
		t.Fatalf("%s never readable: %v (last: %v)", what, err, last)
	}
}
