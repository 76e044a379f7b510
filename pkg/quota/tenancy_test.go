package quota

import (
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
)

func names(ns ...string) func(*gpuaas.TenantQuota) {
	return func(q *gpuaas.TenantQuota) { q.Spec.Namespaces = ns }
}

func selecting(key, value string) func(*gpuaas.TenantQuota) {
	return func(q *gpuaas.TenantQuota) {
		q.Spec.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{key: value}}
	}
}

func namespace(name string, labels map[string]string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
}

func TestAssign(t *testing.T) {
	quotas := []*gpuaas.TenantQuota{
		tenantQuota("newer", 2, names("shared-ns", "b1")),
		tenantQuota("older", 1, names("shared-ns", "a1")),
		tenantQuota("by-label", 3, selecting("team", "ml")),
		tenantQuota("broken-selector", 4, func(q *gpuaas.TenantQuota) {
			q.Spec.NamespaceSelector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "x", Operator: "Bogus"}}}
		}),
	}
	SortByAge(quotas)
	nss := []*corev1.Namespace{
		namespace("shared-ns", nil), namespace("a1", map[string]string{"team": "ml"}),
		namespace("ml-1", map[string]string{"team": "ml"}), namespace("other", nil),
	}
	a := Assign(quotas, nss)
	want := map[string][]string{
		"older":    {"a1", "shared-ns"},
		"newer":    {"b1"}, // b1 does not exist yet: assigned anyway
		"by-label": {"ml-1"},
	}
	if !reflect.DeepEqual(a.Namespaces, want) {
		t.Errorf("Namespaces = %v, want %v", a.Namespaces, want)
	}
	wantConflicts := map[string][]string{
		"newer":    {`namespace shared-ns is charged to the older TenantQuota "older"`},
		"older":    {`namespace a1 is also claimed by TenantQuota "by-label"`, `namespace shared-ns is also claimed by TenantQuota "newer"`},
		"by-label": {`namespace a1 is charged to the older TenantQuota "older"`},
	}
	if !reflect.DeepEqual(a.Conflicts, wantConflicts) {
		t.Errorf("Conflicts = %v, want %v", a.Conflicts, wantConflicts)
	}
}

func TestOwner(t *testing.T) {
	quotas := []*gpuaas.TenantQuota{tenantQuota("b", 1, names("x")), tenantQuota("a", 1, names("x"))}
	SortByAge(quotas) // same age: by name
	owner, others := Owner(quotas, "x", nil)
	if owner.Name != "a" || len(others) != 1 || others[0].Name != "b" {
		t.Fatalf("Owner = %v, others %v", owner.Name, others)
	}
	if owner, _ := Owner(quotas, "y", nil); owner != nil {
		t.Fatalf("unclaimed namespace owned by %s", owner.Name)
	}
}
