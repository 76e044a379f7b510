package chartpolicy

import (
	"testing"

	"github.com/google/cel-go/cel"
)

func readerMeta() map[string]any {
	return map[string]any{"name": "gpuaas-billing-reader-team-a",
		"labels": map[string]any{"gpuaas.io/billing-reader": "true"},
		"ownerReferences": []any{map[string]any{"apiVersion": "gpuaas.io/v1alpha1", "kind": "TenantQuota",
			"name": "team-a", "uid": "u", "controller": true}}}
}

func readerRole() map[string]any {
	return map[string]any{"metadata": readerMeta(), "rules": []any{map[string]any{
		"apiGroups": []any{"gpuaas.io"}, "resources": []any{"tenantusages"}, "verbs": []any{"get"},
		"resourceNames": []any{"team-a-2026-03"}}}}
}

func readerBinding() map[string]any {
	return map[string]any{"metadata": readerMeta(),
		"roleRef":  map[string]any{"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "gpuaas-billing-reader-team-a"},
		"subjects": []any{map[string]any{"kind": "ServiceAccount", "namespace": "team-a", "name": "finance"}}}
}

func allowed(t *testing.T, prg cel.Program, obj, old any) bool {
	t.Helper()
	out, _, err := prg.Eval(map[string]any{"object": obj, "oldObject": old})
	if err != nil {
		t.Fatal(err)
	}
	return out.Value() == true
}

// The controller's ServiceAccount writes only the billing readers' roles,
// of the one rule get on tenantusages by name: it cannot widen one (a verb,
// a resource, every name, an aggregation), drop the label or owner, nor
// create, change or delete any ClusterRole it did not make.
func TestControllerMayOnlyWriteBillingReaderRoles(t *testing.T) {
	prg := validation(t, "-billing-reader-roles")
	rule := func(o map[string]any) map[string]any { return o["rules"].([]any)[0].(map[string]any) }
	for _, c := range []struct {
		name   string
		change func(role map[string]any)
		allow  bool
	}{
		{"the reader role", func(map[string]any) {}, true},
		{"list too", func(r map[string]any) { rule(r)["verbs"] = []any{"get", "list"} }, false},
		{"every verb", func(r map[string]any) { rule(r)["verbs"] = []any{"*"} }, false},
		{"another resource", func(r map[string]any) { rule(r)["resources"] = []any{"tenantquotas"} }, false},
		{"another group", func(r map[string]any) { rule(r)["apiGroups"] = []any{""} }, false},
		{"every name", func(r map[string]any) { delete(rule(r), "resourceNames") }, false},
		{"a second rule", func(r map[string]any) {
			r["rules"] = append(r["rules"].([]any), map[string]any{"apiGroups": []any{""}, "resources": []any{"secrets"}, "verbs": []any{"get"}})
		}, false},
		{"an aggregation", func(r map[string]any) { r["aggregationRule"] = map[string]any{} }, false},
		{"no label", func(r map[string]any) { delete(r["metadata"].(map[string]any), "labels") }, false},
		{"no owner", func(r map[string]any) { delete(r["metadata"].(map[string]any), "ownerReferences") }, false},
		{"another name", func(r map[string]any) { r["metadata"].(map[string]any)["name"] = "admin" }, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			role := readerRole()
			c.change(role)
			if got := allowed(t, prg, role, nil); got != c.allow {
				t.Errorf("create allowed = %v, want %v", got, c.allow)
			}
			if got := allowed(t, prg, role, readerRole()); got != c.allow {
				t.Errorf("update allowed = %v, want %v", got, c.allow)
			}
		})
	}
	// A hand-widened role of ours is put back and may be deleted; a role
	// not of ours (no label) may be neither changed nor deleted.
	widened := readerRole()
	rule(widened)["verbs"] = []any{"*"}
	if !allowed(t, prg, readerRole(), widened) || !allowed(t, prg, nil, widened) {
		t.Error("putting back or deleting a hand-widened reader role: refused")
	}
	foreign := readerRole()
	delete(foreign["metadata"].(map[string]any), "labels")
	if allowed(t, prg, readerRole(), foreign) || allowed(t, prg, nil, foreign) {
		t.Error("taking over or deleting a ClusterRole of our name without our label: allowed")
	}
}

// Bindings: only of the role of their own name, labelled and owned; never
// to another role, never a binding the controller did not make.
func TestControllerMayOnlyBindBillingReaderRoles(t *testing.T) {
	prg := validation(t, "-billing-reader-bindings")
	ref := func(b map[string]any) map[string]any { return b["roleRef"].(map[string]any) }
	for _, c := range []struct {
		name   string
		change func(b map[string]any)
		allow  bool
	}{
		{"the reader binding", func(map[string]any) {}, true},
		{"to cluster-admin", func(b map[string]any) { ref(b)["name"] = "cluster-admin" }, false},
		{"to another tenant's role", func(b map[string]any) { ref(b)["name"] = "gpuaas-billing-reader-team-b" }, false},
		{"to a Role", func(b map[string]any) { ref(b)["kind"] = "Role" }, false},
		{"no label", func(b map[string]any) { delete(b["metadata"].(map[string]any), "labels") }, false},
		{"no owner", func(b map[string]any) { delete(b["metadata"].(map[string]any), "ownerReferences") }, false},
		{"another name", func(b map[string]any) { b["metadata"].(map[string]any)["name"] = "system:admins" }, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := readerBinding()
			c.change(b)
			if got := allowed(t, prg, b, nil); got != c.allow {
				t.Errorf("create allowed = %v, want %v", got, c.allow)
			}
		})
	}
	foreign := readerBinding()
	delete(foreign["metadata"].(map[string]any), "labels")
	if allowed(t, prg, nil, foreign) || allowed(t, prg, readerBinding(), foreign) {
		t.Error("deleting or taking over a binding without our label: allowed")
	}
	if !allowed(t, prg, nil, readerBinding()) {
		t.Error("deleting a reader binding: refused")
	}
}
