package hardwareprofiles

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/deviceclass"
	"github.com/gpuaas/gpu-dra-driver/pkg/hardwareprofile"
)

// ownedIn is the HardwareProfiles in ns by the kind of their owner.
func (w *world) ownedIn(t *testing.T, ns string) map[string][]string {
	t.Helper()
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(hardwareprofile.GroupVersionKind.GroupVersion().WithKind(hardwareprofile.GroupVersionKind.Kind + "List"))
	if err := w.client.List(t.Context(), list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for _, hp := range list.Items {
		for _, ref := range hp.GetOwnerReferences() {
			out[ref.Kind] = append(out[ref.Kind], hp.GetName())
		}
	}
	return out
}

func (w *world) shapeCondition(t *testing.T, name string) *metav1.Condition {
	t.Helper()
	return meta.FindStatusCondition(w.shape(t, name).Status.Conditions, gpuaas.ConditionHardwareProfilesPublished)
}

// TestAProfileAndAShapeOfOneNameAreBothPublished: a shape's
// HardwareProfile has a name of its kind (shape-<shape>), so a GpuProfile
// and a GpuShape of one name are both published in a tenant's namespace,
// whichever comes first, and passes after the first write nothing: neither
// takes or rewrites the other's.
func TestAProfileAndAShapeOfOneNameAreBothPublished(t *testing.T) {
	for _, shapeFirst := range []bool{false, true} {
		p := sharedProfile()
		p.Name, p.UID = "gpu-slot", types.UID("uid-profile-gpu-slot")
		w := newWorld(t, p, slotShape([]string{"team-a"}, "team-a"), tenant("team-a", "", "team-a"))
		w.r.PerTenant = true
		w.install()
		pass := func() {
			if shapeFirst {
				w.reconcileShape(t, "gpu-slot")
			}
			w.reconcile(t, "gpu-slot")
			if !shapeFirst {
				w.reconcileShape(t, "gpu-slot")
			}
		}
		pass()
		got := w.ownedIn(t, "team-a")
		if len(got[gpuaas.GpuProfileKind]) != 1 || got[gpuaas.GpuProfileKind][0] != "gpu-slot" ||
			len(got[gpuaas.GpuShapeKind]) != 1 || got[gpuaas.GpuShapeKind][0] != "shape-gpu-slot" {
			t.Errorf("shape first %v: team-a's HardwareProfiles by owner %v, want the profile's gpu-slot and the shape's shape-gpu-slot", shapeFirst, got)
		}
		if c := w.profileCondition(t, "gpu-slot"); c == nil || c.Status != metav1.ConditionTrue {
			t.Errorf("shape first %v: the profile's condition %+v, want True", shapeFirst, c)
		}
		if c := w.shapeCondition(t, "gpu-slot"); c == nil || c.Status != metav1.ConditionTrue {
			t.Errorf("shape first %v: the shape's condition %+v, want True", shapeFirst, c)
		}
		w.writes = 0
		pass()
		pass()
		if w.writes != 0 {
			t.Errorf("shape first %v: %d HardwareProfile writes in passes with nothing changed, want none", shapeFirst, w.writes)
		}
	}
}

// TestAProfileNamedAsAShapesProfileIsRefusedNamingTheOther: a GpuProfile
// named shape-gpu-slot still meets GpuShape gpu-slot's HardwareProfile;
// the one there first keeps it, and the other's condition names the
// holder; neither rewrites the other's.
func TestAProfileNamedAsAShapesProfileIsRefusedNamingTheOther(t *testing.T) {
	for _, shapeFirst := range []bool{false, true} {
		p := sharedProfile()
		p.Name, p.UID = "shape-gpu-slot", types.UID("uid-profile-shape-gpu-slot")
		w := newWorld(t, p, slotShape([]string{"team-a"}, "team-a"), tenant("team-a", "", "team-a"))
		w.r.PerTenant = true
		w.install()
		first, second := func() { w.reconcile(t, p.Name) }, func() { w.reconcileShape(t, "gpu-slot") }
		if shapeFirst {
			first, second = second, first
		}
		first()
		second()
		holder, want := gpuaas.GpuProfileKind, "it is GpuProfile shape-gpu-slot's"
		c := w.shapeCondition(t, "gpu-slot")
		if shapeFirst {
			holder, want = gpuaas.GpuShapeKind, "it is GpuShape gpu-slot's"
			c = w.profileCondition(t, p.Name)
		}
		if c == nil || c.Status != metav1.ConditionFalse || !strings.Contains(c.Message, want) {
			t.Errorf("shape first %v: the refused one's condition %+v, want NotPublished saying %q", shapeFirst, c, want)
		}
		w.writes = 0
		first()
		second()
		if got := w.ownedIn(t, "team-a"); len(got[holder]) != 1 || len(got) != 1 || w.writes != 0 {
			t.Errorf("shape first %v: team-a's HardwareProfiles by owner %v after %d writes, want the %s's kept untouched", shapeFirst, got, w.writes, holder)
		}
	}
}

// TestAShapesProfileOfTheFormerNameIsReplaced: a shape's HardwareProfile
// published before its name had the kind's prefix (the shape's name, no
// owner label) is deleted once the shape's new one is published.
func TestAShapesProfileOfTheFormerNameIsReplaced(t *testing.T) {
	old := &unstructured.Unstructured{}
	old.SetGroupVersionKind(hardwareprofile.GroupVersionKind)
	old.SetNamespace("team-a")
	old.SetName("gpu-slot")
	old.SetLabels(map[string]string{deviceclass.ManagedByLabel: deviceclass.ManagedByValue})
	old.SetAnnotations(map[string]string{hardwareprofile.ShapeAnnotation: "gpu-slot"})
	old.SetOwnerReferences([]metav1.OwnerReference{{APIVersion: gpuaas.GroupVersion.String(), Kind: gpuaas.GpuShapeKind, Name: "gpu-slot", UID: "uid-gpu-slot"}})
	old.Object["spec"] = map[string]any{"identifiers": []any{}}
	w := newWorld(t, slotShape([]string{"team-a"}, "team-a"), tenant("team-a", "", "team-a"))
	w.install()
	if err := w.client.Create(t.Context(), old); err != nil {
		t.Fatal(err)
	}
	w.reconcileShape(t, "gpu-slot")
	w.hardwareProfileIn(t, "team-a", "shape-gpu-slot")
	w.absent(t, "team-a", "gpu-slot", "the shape's former name, replaced by shape-gpu-slot")
}
