package kueuemirror

import (
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/kueue"
)

// Issue 15: a TenantQuota backed by a ClusterQueue, so Kueue and the
// TenantQuota never disagree. The admin's own fields of the queue stay.
func TestClusterQueueMirrorsTheTenantQuota(t *testing.T) {
	q := tenantQuota("team-a", 0, gpuaas.TenantQuotaSpec{Namespaces: []string{"a"}, Cohort: "research",
		Limits: gpuaas.QuotaLimits{GpuUnits: qty("1.5")}, Kueue: &gpuaas.TenantKueue{ClusterQueue: "team-a-gpus"}})
	q.UID = "tq-uid"
	q.Status.Namespaces = []string{"a"}
	c := newFakeClient(t, q)
	r := &kueueQueueReconciler{quotas: c, direct: c}
	key := reconcile.Request{NamespacedName: types.NamespacedName{Name: "team-a"}}
	if _, err := r.Reconcile(ctx(t), key); err != nil {
		t.Fatal(err)
	}
	cq := getClusterQueue(t, c, "team-a-gpus")
	if got := nominal(cq); got != "1500" {
		t.Errorf("nominal quota %q, want 1500 milli-units for 1.5 GPU units", got)
	}
	// The admin tunes preemption; a new limit changes only what mirrors.
	_ = unstructured.SetNestedField(cq.Object, "Any", "spec", "preemption", "reclaimWithinCohort")
	if err := c.Update(ctx(t), cq); err != nil {
		t.Fatal(err)
	}
	q.Spec.Limits.GpuUnits = qty("2")
	if err := c.Update(ctx(t), q); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Reconcile(ctx(t), key); err != nil {
		t.Fatal(err)
	}
	cq = getClusterQueue(t, c, "team-a-gpus")
	if got := nominal(cq); got != "2000" {
		t.Errorf("nominal quota %q after the limit changed, want 2000", got)
	}
	if p, _, _ := unstructured.NestedString(cq.Object, "spec", "preemption", "reclaimWithinCohort"); p != "Any" {
		t.Errorf("the admin's preemption setting was lost: %q", p)
	}
}

func TestClusterQueueOfAnotherOwnerIsNotTaken(t *testing.T) {
	q := tenantQuota("team-a", 0, gpuaas.TenantQuotaSpec{Namespaces: []string{"a"},
		Limits: gpuaas.QuotaLimits{GpuUnits: qty("1")}, Kueue: &gpuaas.TenantKueue{ClusterQueue: "shared"}})
	q.Status.Namespaces = []string{"a"}
	other := kueue.Object("ClusterQueue")
	other.Object["spec"] = map[string]any{}
	other.SetName("shared")
	c := newFakeClient(t, q, other)
	r := &kueueQueueReconciler{quotas: c, direct: c}
	if _, err := r.Reconcile(ctx(t), reconcile.Request{NamespacedName: types.NamespacedName{Name: "team-a"}}); err == nil {
		t.Fatal("an existing ClusterQueue of someone else was taken over")
	}
}

func getClusterQueue(t *testing.T, c client.Client, name string) *unstructured.Unstructured {
	t.Helper()
	cq := kueue.Object("ClusterQueue")
	if err := c.Get(ctx(t), types.NamespacedName{Name: name}, cq); err != nil {
		t.Fatalf("ClusterQueue %s: %v", name, err)
	}
	return cq
}

func nominal(cq *unstructured.Unstructured) string {
	groups, _, _ := unstructured.NestedSlice(cq.Object, "spec", "resourceGroups")
	if len(groups) == 0 {
		return ""
	}
	flavor := groups[0].(map[string]any)["flavors"].([]any)[0].(map[string]any)
	return flavor["resources"].([]any)[0].(map[string]any)["nominalQuota"].(string)
}
