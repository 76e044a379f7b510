package billingreaders

import (
	"context"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
)

var march = time.Date(2026, 3, 31, 23, 0, 0, 0, time.UTC)

func quota(name string, readers ...rbacv1.Subject) *gpuaas.TenantQuota {
	q := &gpuaas.TenantQuota{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name)},
		Spec: gpuaas.TenantQuotaSpec{Namespaces: []string{name}}}
	if readers != nil {
		q.Spec.Billing = &gpuaas.TenantBilling{Readers: readers}
	}
	return q
}

func usage(tenant, period string) *gpuaas.TenantUsage {
	return &gpuaas.TenantUsage{ObjectMeta: metav1.ObjectMeta{Name: tenant + "-" + period},
		Spec: gpuaas.TenantUsageSpec{Tenant: tenant, Period: period}}
}

var reader = rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Namespace: "team-a", Name: "finance"}

func newReconciler(t *testing.T, objs ...client.Object) (*Reconciler, client.Client) {
	t.Helper()
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	if err := gpuaas.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientBuilder().WithScheme(s).WithObjects(objs...).Build()
	return &Reconciler{Client: c, Now: func() time.Time { return march }}, c
}

func reconcileQuota(t *testing.T, r *Reconciler, name string) ctrl.Result {
	t.Helper()
	res, err := r.Reconcile(context.Background(), ctrl.Request{NamespacedName: types.NamespacedName{Name: name}})
	if err != nil {
		t.Fatalf("reconciling %s: %v", name, err)
	}
	return res
}

func get(t *testing.T, c client.Client) (*rbacv1.ClusterRole, *rbacv1.ClusterRoleBinding) {
	t.Helper()
	var role rbacv1.ClusterRole
	var b rbacv1.ClusterRoleBinding
	if err := c.Get(context.Background(), client.ObjectKey{Name: Name("team-a")}, &role); err != nil {
		t.Fatalf("the readers' ClusterRole: %v", err)
	}
	if err := c.Get(context.Background(), client.ObjectKey{Name: Name("team-a")}, &b); err != nil {
		t.Fatalf("the readers' ClusterRoleBinding: %v", err)
	}
	return &role, &b
}

// The role grants get on the tenant's TenantUsages by name (those that
// exist and this month's), not another tenant's, not tenant team-a-b's
// whose names share a prefix; the binding names the readers; the quota owns
// both; the reconciler comes back when the month ends.
func TestReadersGetTheirTenantsUsagesOnly(t *testing.T) {
	r, c := newReconciler(t, quota("team-a", reader), usage("team-a", "2026-02"),
		usage("team-b", "2026-03"), usage("team-a-b", "2026-03"))
	res := reconcileQuota(t, r, "team-a")
	role, b := get(t, c)
	want := []string{"team-a-2026-02", "team-a-2026-03"}
	if len(role.Rules) != 1 || strings.Join(role.Rules[0].ResourceNames, ",") != strings.Join(want, ",") ||
		strings.Join(role.Rules[0].Verbs, ",") != "get" || strings.Join(role.Rules[0].Resources, ",") != "tenantusages" ||
		strings.Join(role.Rules[0].APIGroups, ",") != "gpuaas.io" {
		t.Errorf("rules %+v, want get on gpuaas.io tenantusages %v", role.Rules, want)
	}
	if len(b.Subjects) != 1 || b.Subjects[0] != reader || b.RoleRef.Name != role.Name || b.RoleRef.Kind != "ClusterRole" {
		t.Errorf("binding %+v to %+v, want %v to the role", b.Subjects, b.RoleRef, reader)
	}
	for _, obj := range []client.Object{role, b} {
		refs := obj.GetOwnerReferences()
		if len(refs) != 1 || refs[0].UID != "uid-team-a" || refs[0].Kind != "TenantQuota" || refs[0].Controller == nil || !*refs[0].Controller {
			t.Errorf("%T owners %+v, want the quota", obj, refs)
		}
		if obj.GetLabels()[Label] != "true" {
			t.Errorf("%T labels %v, want %s=true", obj, obj.GetLabels(), Label)
		}
	}
	if res.RequeueAfter < time.Hour || res.RequeueAfter > time.Hour+time.Minute {
		t.Errorf("requeue after %v, want at the month's end (1h)", res.RequeueAfter)
	}
	// March's usage recorded; April: its TenantUsage is granted from the
	// month's first reconcile.
	if err := c.Create(context.Background(), usage("team-a", "2026-03")); err != nil {
		t.Fatal(err)
	}
	r.Now = func() time.Time { return march.Add(2 * time.Hour) }
	reconcileQuota(t, r, "team-a")
	role, _ = get(t, c)
	if got := strings.Join(role.Rules[0].ResourceNames, ","); got != "team-a-2026-02,team-a-2026-03,team-a-2026-04" {
		t.Errorf("in April the role names %s, want the April usage added", got)
	}
}

// A hand edit of the role (more verbs, another resource) or of the binding
// (another subject) is put back.
func TestHandEditsPutBack(t *testing.T) {
	r, c := newReconciler(t, quota("team-a", reader))
	reconcileQuota(t, r, "team-a")
	role, b := get(t, c)
	role.Rules[0].Verbs = []string{"get", "list"}
	role.Rules = append(role.Rules, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get"}})
	b.Subjects = append(b.Subjects, rbacv1.Subject{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "mallory"})
	ctx := context.Background()
	if err := c.Update(ctx, role); err != nil {
		t.Fatal(err)
	}
	if err := c.Update(ctx, b); err != nil {
		t.Fatal(err)
	}
	reconcileQuota(t, r, "team-a")
	role, b = get(t, c)
	if len(role.Rules) != 1 || strings.Join(role.Rules[0].Verbs, ",") != "get" {
		t.Errorf("rules after the edit %+v, want get on tenantusages only", role.Rules)
	}
	if len(b.Subjects) != 1 || b.Subjects[0] != reader {
		t.Errorf("subjects after the edit %+v, want %v", b.Subjects, reader)
	}
}

// A user reader without apiGroup is stored with the group the API server
// defaults, and that is no change to write again.
func TestUserReaderGetsRBACGroup(t *testing.T) {
	r, c := newReconciler(t, quota("team-a", rbacv1.Subject{Kind: rbacv1.UserKind, Name: "alice"}))
	reconcileQuota(t, r, "team-a")
	_, b := get(t, c)
	if len(b.Subjects) != 1 || b.Subjects[0].APIGroup != rbacv1.GroupName {
		t.Errorf("subjects %+v, want alice in %s", b.Subjects, rbacv1.GroupName)
	}
	rv := b.ResourceVersion
	reconcileQuota(t, r, "team-a")
	if _, b = get(t, c); b.ResourceVersion != rv {
		t.Errorf("the binding was written again unchanged (resourceVersion %s -> %s)", rv, b.ResourceVersion)
	}
}

// Readers removed: both objects go. A ClusterRole of the same name that is
// not ours (no label) is neither changed nor deleted.
func TestReadersRemovedAndForeignObjectsLeftAlone(t *testing.T) {
	r, c := newReconciler(t, quota("team-a", reader))
	reconcileQuota(t, r, "team-a")
	ctx := context.Background()
	var q gpuaas.TenantQuota
	if err := c.Get(ctx, client.ObjectKey{Name: "team-a"}, &q); err != nil {
		t.Fatal(err)
	}
	q.Spec.Billing = nil
	if err := c.Update(ctx, &q); err != nil {
		t.Fatal(err)
	}
	reconcileQuota(t, r, "team-a")
	for _, obj := range []client.Object{&rbacv1.ClusterRole{}, &rbacv1.ClusterRoleBinding{}} {
		if err := c.Get(ctx, client.ObjectKey{Name: Name("team-a")}, obj); !apierrors.IsNotFound(err) {
			t.Errorf("%T after the readers were removed: %v, want not found", obj, err)
		}
	}

	foreign := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: Name("team-b")},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"*"}, Resources: []string{"*"}, Verbs: []string{"*"}}}}
	r, c = newReconciler(t, quota("team-b", reader), foreign)
	if _, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: types.NamespacedName{Name: "team-b"}}); err == nil {
		t.Error("reconciling over an admin's ClusterRole of our name: no error")
	}
	var have rbacv1.ClusterRole
	if err := c.Get(ctx, client.ObjectKey{Name: Name("team-b")}, &have); err != nil || len(have.Rules) != 1 || have.Rules[0].Verbs[0] != "*" {
		t.Errorf("the admin's ClusterRole was changed: %+v (%v)", have.Rules, err)
	}
	if err := c.Get(ctx, client.ObjectKey{Name: Name("team-b")}, &rbacv1.ClusterRoleBinding{}); !apierrors.IsNotFound(err) {
		t.Errorf("a binding to the admin's ClusterRole was made: %v", err)
	}
}

// Names fit the API server's limit; long tenants that start alike differ.
func TestNamesOfLongTenants(t *testing.T) {
	if got := Name("team-a"); got != "gpuaas-billing-reader-team-a" {
		t.Errorf("Name(team-a) = %s", got)
	}
	a, b := Name(strings.Repeat("x", 240)+"a"), Name(strings.Repeat("x", 240)+"b")
	if len(a) > 253 || len(b) > 253 || a == b || a != Name(strings.Repeat("x", 240)+"a") {
		t.Errorf("long names %q (%d) and %q (%d): want distinct, stable, at most 253", a, len(a), b, len(b))
	}
}
