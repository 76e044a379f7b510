package hardwareprofiles

import (
	"slices"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller/internal/testworld"
	"github.com/gpuaas/gpu-dra-driver/pkg/hardwareprofile"
	"github.com/gpuaas/gpu-dra-driver/pkg/kueue"
)

// tenant is a TenantQuota over namespaces as the quota reconciler
// resolved them, Kueue-managed through clusterQueue where set.
func tenant(name, clusterQueue string, namespaces ...string) *gpuaas.TenantQuota {
	q := testworld.TenantQuota(name, 0, gpuaas.TenantQuotaSpec{Namespaces: namespaces, Limits: gpuaas.QuotaLimits{GpuUnits: testworld.Qty("2")}})
	if clusterQueue != "" {
		q.Spec.Kueue = &gpuaas.TenantKueue{ClusterQueue: clusterQueue}
	}
	q.Status.Namespaces = namespaces
	return q
}

// slotHP is slotShape's HardwareProfile's name (hardwareprofile.ShapeName).
const slotHP = "shape-gpu-slot"

// slotShape is a shape entitled to tenants whose template the shapes
// reconciler has written in templates.
func slotShape(tenants []string, templates ...string) *gpuaas.GpuShape {
	return &gpuaas.GpuShape{
		ObjectMeta: metav1.ObjectMeta{Name: "gpu-slot", UID: "uid-gpu-slot", Generation: 1},
		Spec: gpuaas.GpuShapeSpec{
			DisplayName: "One H100 and its NIC",
			Requests:    []gpuaas.ShapeRequest{{Name: "gpu", Profile: "h100"}, {Name: "nic", DeviceClassName: "nic.example.com"}},
			Tenants:     tenants,
		},
		Status: gpuaas.GpuShapeStatus{Namespaces: templates},
	}
}

func localQueue(namespace, name, clusterQueue string) *unstructured.Unstructured {
	lq := kueue.Object("LocalQueue")
	lq.SetNamespace(namespace)
	lq.SetName(name)
	lq.Object["spec"] = map[string]any{"clusterQueue": clusterQueue}
	return lq
}

// withKueue serves Kueue's LocalQueue kind and creates queues.
func (w *world) withKueue(t *testing.T, queues ...*unstructured.Unstructured) {
	t.Helper()
	w.mapper.Add(kueue.API.WithKind("LocalQueue"), meta.RESTScopeNamespace)
	for _, q := range queues {
		if err := w.client.Create(t.Context(), q); err != nil {
			t.Fatal(err)
		}
	}
}

func (w *world) reconcileShape(t *testing.T, name string) reconcile.Result {
	t.Helper()
	res, err := ShapeReconciler{w.r}.Reconcile(t.Context(), reconcile.Request{NamespacedName: client.ObjectKey{Name: name}})
	if err != nil {
		t.Fatalf("reconciling shape %s: %v", name, err)
	}
	return res
}

func (w *world) hardwareProfileIn(t *testing.T, ns, name string) *unstructured.Unstructured {
	t.Helper()
	hp, err := w.lookup(t, ns, name)
	if err != nil {
		t.Fatalf("reading HardwareProfile %s/%s: %v", ns, name, err)
	}
	return hp
}

func (w *world) lookup(t *testing.T, ns, name string) (*unstructured.Unstructured, error) {
	t.Helper()
	hp := &unstructured.Unstructured{}
	hp.SetGroupVersionKind(hardwareprofile.GroupVersionKind)
	return hp, w.client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: name}, hp)
}

func (w *world) absent(t *testing.T, ns, name, why string) {
	t.Helper()
	if _, err := w.lookup(t, ns, name); !apierrors.IsNotFound(err) {
		t.Errorf("HardwareProfile %s/%s: %v, want none (%s)", ns, name, err, why)
	}
}

func (w *world) profileCondition(t *testing.T, name string) *metav1.Condition {
	t.Helper()
	var p gpuaas.GpuProfile
	if err := w.client.Get(t.Context(), client.ObjectKey{Name: name}, &p); err != nil {
		t.Fatal(err)
	}
	return meta.FindStatusCondition(p.Status.Conditions, gpuaas.ConditionHardwareProfilesPublished)
}

func (w *world) shape(t *testing.T, name string) *gpuaas.GpuShape {
	t.Helper()
	var s gpuaas.GpuShape
	if err := w.client.Get(t.Context(), client.ObjectKey{Name: name}, &s); err != nil {
		t.Fatal(err)
	}
	return &s
}

func scheduling(t *testing.T, hp *unstructured.Unstructured) map[string]any {
	t.Helper()
	s, _, _ := unstructured.NestedMap(hp.Object, "spec", "scheduling")
	return s
}

func templateName(hp *unstructured.Unstructured) string {
	name, _, _ := unstructured.NestedString(hp.Object, "spec", "dra", "resourceClaimTemplateName")
	return name
}

// TestShapeIsPublishedInItsTenantsNamespacesNamingItsTemplate: one
// HardwareProfile per entitled tenant namespace holding the template,
// naming it, owned by the shape, scheduled as the tenant is: Node for a
// tenant without Kueue, Queue with its LocalQueue for a Kueue-managed one;
// none for a tenant the shape does not name, nor in the global namespace
// (no template there); the status says where.
func TestShapeIsPublishedInItsTenantsNamespacesNamingItsTemplate(t *testing.T) {
	w := newWorld(t,
		slotShape([]string{"team-a", "team-b"}, "team-a", "team-b"),
		tenant("team-a", "", "team-a"), tenant("team-b", "cq-b", "team-b"), tenant("team-c", "", "team-c"))
	w.install()
	w.withKueue(t, localQueue("team-b", "gpus", "cq-b"), localQueue("team-b", "other", "cq-x"))
	w.reconcileShape(t, "gpu-slot")

	a := w.hardwareProfileIn(t, "team-a", slotHP)
	if got := templateName(a); got != "gpu-slot" {
		t.Errorf("team-a: spec.dra.resourceClaimTemplateName %q, want the shape's template gpu-slot", got)
	}
	if got := scheduling(t, a); got["type"] != "Node" {
		t.Errorf("team-a (no Kueue): scheduling %v, want type Node", got)
	}
	if refs := a.GetOwnerReferences(); len(refs) != 1 || refs[0].UID != "uid-gpu-slot" || refs[0].Kind != gpuaas.GpuShapeKind {
		t.Errorf("owner references %+v, want the GpuShape's (garbage collection takes it with the shape)", refs)
	}
	if got := a.GetAnnotations()[hardwareprofile.DisplayNameAnnotation]; got != "One H100 and its NIC" {
		t.Errorf("display name %q, want the shape's", got)
	}
	b := w.hardwareProfileIn(t, "team-b", slotHP)
	want := map[string]any{"type": "Queue", "kueue": map[string]any{"localQueueName": "gpus"}}
	if got := scheduling(t, b); !equalJSON(got, want) {
		t.Errorf("team-b (Kueue, ClusterQueue cq-b): scheduling %v, want %v (its LocalQueue of cq-b)", got, want)
	}
	w.absent(t, "team-c", slotHP, "the shape does not name team-c")
	w.absent(t, namespace, slotHP, "no template in the global namespace")

	s := w.shape(t, "gpu-slot")
	if !slices.Equal(s.Status.HardwareProfileNamespaces, []string{"team-a", "team-b"}) {
		t.Errorf("status.hardwareProfileNamespaces %v, want [team-a team-b]", s.Status.HardwareProfileNamespaces)
	}
	if c := meta.FindStatusCondition(s.Status.Conditions, gpuaas.ConditionHardwareProfilesPublished); c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("condition %+v, want HardwareProfilesPublished True", c)
	}
}

// TestShapeOnlyWhereItsTemplateIs: an entitled namespace without the
// template (the shapes reconciler found a conflict, or has not written it
// yet) gets no HardwareProfile: a workload naming it would start nothing.
func TestShapeOnlyWhereItsTemplateIs(t *testing.T) {
	w := newWorld(t, slotShape([]string{"team-a"}, "team-a"), tenant("team-a", "", "team-a", "team-a-dev"))
	w.install()
	w.reconcileShape(t, "gpu-slot")
	w.hardwareProfileIn(t, "team-a", slotHP)
	w.absent(t, "team-a-dev", slotHP, "no template there")
}

// TestShapeHandEditsArePutBackAndATenantRemovedTakesItsProfile: a hand
// edit of the template name, scheduling and identifiers is put back; a
// tenant removed from the shape loses the HardwareProfile (its template
// goes too), the other keeps it.
func TestShapeHandEditsArePutBackAndATenantRemovedTakesItsProfile(t *testing.T) {
	w := newWorld(t, slotShape([]string{"team-a", "team-b"}, "team-a", "team-b"), tenant("team-a", "", "team-a"), tenant("team-b", "", "team-b"))
	w.install()
	w.reconcileShape(t, "gpu-slot")
	hp := w.hardwareProfileIn(t, "team-a", slotHP)
	want := hp.DeepCopy()
	if err := unstructured.SetNestedField(hp.Object, "someone-elses", "spec", "dra", "resourceClaimTemplateName"); err != nil {
		t.Fatal(err)
	}
	if err := unstructured.SetNestedSlice(hp.Object, []any{}, "spec", "identifiers"); err != nil {
		t.Fatal(err)
	}
	if err := w.client.Update(t.Context(), hp); err != nil {
		t.Fatal(err)
	}
	w.reconcileShape(t, "gpu-slot")
	got := w.hardwareProfileIn(t, "team-a", slotHP)
	if !equalJSON(got.Object["spec"], want.Object["spec"]) {
		t.Errorf("spec %v, want %v put back", got.Object["spec"], want.Object["spec"])
	}

	s := w.shape(t, "gpu-slot")
	s.Spec.Tenants = []string{"team-b"}
	if err := w.client.Update(t.Context(), s); err != nil {
		t.Fatal(err)
	}
	w.reconcileShape(t, "gpu-slot")
	w.absent(t, "team-a", slotHP, "team-a was removed from the shape")
	w.hardwareProfileIn(t, "team-b", slotHP)
	if got := w.shape(t, "gpu-slot").Status.HardwareProfileNamespaces; !slices.Equal(got, []string{"team-b"}) {
		t.Errorf("status.hardwareProfileNamespaces %v, want [team-b]", got)
	}
}

// TestAKueueManagedTenantWithoutItsLocalQueueGetsNoneUntilItHasOne: the
// dashboard would not offer a Queue profile naming a LocalQueue that does
// not exist, and a Node one would start workloads outside the tenant's
// queue: nothing is published there, the condition names the namespace;
// once the LocalQueue exists it is published with it.
func TestAKueueManagedTenantWithoutItsLocalQueueGetsNoneUntilItHasOne(t *testing.T) {
	w := newWorld(t, slotShape([]string{"team-b"}, "team-b"), tenant("team-b", "cq-b", "team-b"))
	w.install()
	w.withKueue(t, localQueue("team-b", "elsewhere", "cq-other"))
	w.reconcileShape(t, "gpu-slot")
	w.absent(t, "team-b", slotHP, "no LocalQueue of cq-b in team-b")
	c := meta.FindStatusCondition(w.shape(t, "gpu-slot").Status.Conditions, gpuaas.ConditionHardwareProfilesPublished)
	if c == nil || c.Status != metav1.ConditionFalse || c.Reason != gpuaas.ReasonNotPublished ||
		!strings.Contains(c.Message, "team-b: tenant team-b is Kueue-managed (ClusterQueue cq-b) and the namespace has no LocalQueue of it") {
		t.Errorf("condition %+v, want NotPublished naming team-b and its missing LocalQueue", c)
	}

	if err := w.client.Create(t.Context(), localQueue("team-b", "gpus", "cq-b")); err != nil {
		t.Fatal(err)
	}
	w.now = w.now.Add(queuesFresh) // the namespace's LocalQueues are listed again
	w.reconcileShape(t, "gpu-slot")
	if got := scheduling(t, w.hardwareProfileIn(t, "team-b", slotHP)); got["type"] != "Queue" {
		t.Errorf("scheduling %v, want Queue once the LocalQueue exists", got)
	}
	if c := meta.FindStatusCondition(w.shape(t, "gpu-slot").Status.Conditions, gpuaas.ConditionHardwareProfilesPublished); c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("condition %+v, want True", c)
	}
}

// TestProfilesPerTenantAreScheduledAsTheTenantIs: with PerTenant a profile
// is published in the global namespace as its settings say and in every
// tenant namespace as its tenant is: Node without Kueue (its own
// localQueueName does not apply there), Queue with the LocalQueue of the
// tenant's ClusterQueue (the profile's localQueueName preferred among
// several) and the profile's priority class.
func TestProfilesPerTenantAreScheduledAsTheTenantIs(t *testing.T) {
	p := sharedProfile()
	p.Spec.HardwareProfile = &gpuaas.HardwareProfileSettings{LocalQueueName: "interactive", PriorityClass: "notebooks"}
	w := newWorld(t, p, tenant("team-a", "", "team-a"), tenant("team-b", "cq-b", "team-b", "team-b-dev"))
	w.r.PerTenant = true
	w.install()
	w.withKueue(t, localQueue("team-b", "batch", "cq-b"), localQueue("team-b", "interactive", "cq-b"), localQueue("team-b-dev", "dev", "cq-b"))
	w.reconcile(t, "shared-4way")

	for _, tc := range []struct {
		ns   string
		want map[string]any
	}{
		{namespace, map[string]any{"type": "Queue", "kueue": map[string]any{"localQueueName": "interactive", "priorityClass": "notebooks"}}},
		{"team-a", map[string]any{"type": "Node"}},
		{"team-b", map[string]any{"type": "Queue", "kueue": map[string]any{"localQueueName": "interactive", "priorityClass": "notebooks"}}},
		{"team-b-dev", map[string]any{"type": "Queue", "kueue": map[string]any{"localQueueName": "dev", "priorityClass": "notebooks"}}},
	} {
		hp := w.hardwareProfileIn(t, tc.ns, "shared-4way")
		if got := scheduling(t, hp); !equalJSON(got, tc.want) {
			t.Errorf("%s: scheduling %v, want %v", tc.ns, got, tc.want)
		}
		if _, has, _ := unstructured.NestedMap(hp.Object, "spec", "dra"); has {
			t.Errorf("%s: a profile's HardwareProfile has spec.dra (it is asked by its extended resource)", tc.ns)
		}
	}
	var got gpuaas.GpuProfile
	if err := w.client.Get(t.Context(), client.ObjectKey{Name: "shared-4way"}, &got); err != nil {
		t.Fatal(err)
	}
	if want := []string{"redhat-ods-applications", "team-a", "team-b", "team-b-dev"}; !slices.Equal(got.Status.HardwareProfileNamespaces, want) {
		t.Errorf("status.hardwareProfileNamespaces %v, want %v", got.Status.HardwareProfileNamespaces, want)
	}

	// The tenant gives up team-b-dev: its HardwareProfile goes.
	q := &gpuaas.TenantQuota{}
	if err := w.client.Get(t.Context(), client.ObjectKey{Name: "team-b"}, q); err != nil {
		t.Fatal(err)
	}
	q.Status.Namespaces = []string{"team-b"}
	if err := w.client.Status().Update(t.Context(), q); err != nil {
		t.Fatal(err)
	}
	w.reconcile(t, "shared-4way")
	w.absent(t, "team-b-dev", "shared-4way", "no longer the tenant's namespace")
	w.hardwareProfileIn(t, "team-b", "shared-4way")
}

// TestNotServedIsSaidOnTheStatus: without the CRD nothing is read or
// written, and the condition says why.
func TestNotServedIsSaidOnTheStatus(t *testing.T) {
	w := newWorld(t, slotShape([]string{"team-a"}, "team-a"), tenant("team-a", "", "team-a"))
	w.reconcileShape(t, "gpu-slot")
	if w.requests != 0 {
		t.Errorf("%d HardwareProfile requests without the CRD, want none", w.requests)
	}
	c := meta.FindStatusCondition(w.shape(t, "gpu-slot").Status.Conditions, gpuaas.ConditionHardwareProfilesPublished)
	if c == nil || c.Status != metav1.ConditionFalse || !strings.Contains(c.Message, "not served") {
		t.Errorf("condition %+v, want NotPublished: not served", c)
	}
}
