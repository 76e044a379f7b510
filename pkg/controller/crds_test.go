package controller

import (
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/gpuaas/gpu-dra-driver/config/crd"
)

// Issue 40: a rollback's controller applied its own GpuNode CRD over the
// newer one, whose posture enum had a value more (ExclusivelyAllocated):
// an added enum value did not count as newer, only an added field did.
// A live CRD with an enum value this binary lacks is newer now.
func TestCRDWithAnEnumValueMoreIsNewer(t *testing.T) {
	raw, err := crd.Files.ReadFile("gpuaas.io_gpunodes.yaml")
	if err != nil {
		t.Fatal(err)
	}
	ours := &unstructured.Unstructured{}
	if err := yaml.Unmarshal(raw, &ours.Object); err != nil {
		t.Fatal(err)
	}
	live := ours.DeepCopy()
	versions, _, _ := unstructured.NestedSlice(live.Object, "spec", "versions")
	path := []string{"schema", "openAPIV3Schema", "properties", "status", "properties", "posture", "enum"}
	enum, found, err := unstructured.NestedSlice(versions[0].(map[string]any), path...)
	if !found || err != nil || !slices.Contains(enum, any("ExclusivelyAllocated")) {
		t.Fatalf("GpuNode's status.posture enum: %v (found %v, %v)", enum, found, err)
	}
	if extra := unknownFields(schemaFields(live), schemaFields(ours)); len(extra) != 0 {
		t.Fatalf("the same CRD has unknown fields %v", extra)
	}
	if err := unstructured.SetNestedSlice(versions[0].(map[string]any), append(enum, "LeasedToAFutureKind"), path...); err != nil {
		t.Fatal(err)
	}
	if err := unstructured.SetNestedSlice(live.Object, versions, "spec", "versions"); err != nil {
		t.Fatal(err)
	}
	extra := unknownFields(schemaFields(live), schemaFields(ours))
	if want := []string{"v1alpha1:.status.posture=LeasedToAFutureKind"}; !slices.Equal(extra, want) {
		t.Errorf("a live CRD with a posture more: unknown %v, want %v", extra, want)
	}
	// A live CRD of the release before (no ExclusivelyAllocated) is older:
	// it is brought up to ours, not left.
	older := slices.DeleteFunc(slices.Clone(enum), func(v any) bool { return v == "ExclusivelyAllocated" })
	if err := unstructured.SetNestedSlice(versions[0].(map[string]any), older, path...); err != nil {
		t.Fatal(err)
	}
	if err := unstructured.SetNestedSlice(live.Object, versions, "spec", "versions"); err != nil {
		t.Fatal(err)
	}
	if extra := unknownFields(schemaFields(live), schemaFields(ours)); len(extra) != 0 {
		t.Errorf("the release before's CRD: unknown %v, want none (it is older)", extra)
	}
}
