package hardwareprofile

import (
	"reflect"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
)

func sharedProfile() *gpuaas.GpuProfile {
	return &gpuaas.GpuProfile{
		ObjectMeta: metav1.ObjectMeta{Name: "shared-4way", UID: "uid-1"},
		Spec: gpuaas.GpuProfileSpec{
			DisplayName:          "Shared GPU, 4-way",
			Description:          "A quarter of an H100",
			Selector:             gpuaas.ProfileSelector{Type: gpuaas.DeviceTypeShared},
			ExtendedResourceName: ptr.To("gpuaas.io/shared-gpu"),
		},
	}
}

func quantity(s string) *resource.Quantity { return ptr.To(resource.MustParse(s)) }

func TestRenderDefaultsAndAccelerator(t *testing.T) {
	hp, err := Render(sharedProfile(), "redhat-ods-applications")
	if err != nil {
		t.Fatal(err)
	}
	if got := hp.GroupVersionKind(); got != GroupVersionKind {
		t.Errorf("kind %v, want %v", got, GroupVersionKind)
	}
	if hp.GetNamespace() != "redhat-ods-applications" || hp.GetName() != "shared-4way" {
		t.Errorf("rendered %s/%s, want redhat-ods-applications/shared-4way", hp.GetNamespace(), hp.GetName())
	}
	wantAnnotations := map[string]string{
		DisplayNameAnnotation: "Shared GPU, 4-way", DescriptionAnnotation: "A quarter of an H100",
		DisabledAnnotation: "false", ProfileAnnotation: "shared-4way",
	}
	if got, want := hp.GetAnnotations(), wantAnnotations; !reflect.DeepEqual(got, want) {
		t.Errorf("annotations:\n got %v\nwant %v", got, want)
	}
	if got, want := hp.GetLabels(), map[string]string{"app.kubernetes.io/managed-by": "gpuaas-dra-controller", OwnerLabel: "uid-1"}; !reflect.DeepEqual(got, want) {
		t.Errorf("labels:\n got %v\nwant %v", got, want)
	}
	refs := hp.GetOwnerReferences()
	if len(refs) != 1 || refs[0].Kind != "GpuProfile" || refs[0].Name != "shared-4way" || refs[0].UID != "uid-1" || !ptr.Deref(refs[0].Controller, false) {
		t.Errorf("owner references %+v, want the GpuProfile as controller", refs)
	}
	wantSpec := map[string]any{
		"identifiers": []any{
			map[string]any{"displayName": "CPU", "identifier": "cpu", "resourceType": "CPU",
				"minCount": int64(1), "defaultCount": int64(2), "maxCount": int64(8)},
			map[string]any{"displayName": "Memory", "identifier": "memory", "resourceType": "Memory",
				"minCount": "2Gi", "defaultCount": "8Gi", "maxCount": "64Gi"},
			map[string]any{"displayName": "Shared GPU, 4-way", "identifier": "gpuaas.io/shared-gpu", "resourceType": "Accelerator",
				"minCount": int64(1), "defaultCount": int64(1), "maxCount": int64(1)},
		},
		"scheduling": map[string]any{"type": "Node"},
	}
	if got, want := hp.Object["spec"], wantSpec; !reflect.DeepEqual(got, want) {
		t.Errorf("spec:\n got %v\nwant %v", got, want)
	}
}

func TestRenderAdminSettings(t *testing.T) {
	p := sharedProfile()
	p.Spec.HardwareProfile = &gpuaas.HardwareProfileSettings{
		DisplayName: "Notebook with a shared GPU", Description: "For exploration",
		CPU:            &gpuaas.ResourceRange{Min: quantity("500m"), Default: quantity("1")},
		Memory:         &gpuaas.ResourceRange{Default: quantity("16Gi"), Max: quantity("32Gi")},
		MaxDevices:     ptr.To[int32](4),
		LocalQueueName: "team-a", PriorityClass: "interactive",
	}
	hp, err := Render(p, "ns")
	if err != nil {
		t.Fatal(err)
	}
	annotations := hp.GetAnnotations()
	if annotations[DisplayNameAnnotation] != "Notebook with a shared GPU" || annotations[DescriptionAnnotation] != "For exploration" {
		t.Errorf("annotations %v, want the hardwareProfile overrides", annotations)
	}
	spec := hp.Object["spec"].(map[string]any)
	ids := spec["identifiers"].([]any)
	cpu, memory, gpu := ids[0].(map[string]any), ids[1].(map[string]any), ids[2].(map[string]any)
	if cpu["minCount"] != "500m" || cpu["defaultCount"] != int64(1) || cpu["maxCount"] != int64(8) {
		t.Errorf("cpu identifier %v, want 500m..8 default 1", cpu)
	}
	if memory["minCount"] != "2Gi" || memory["defaultCount"] != "16Gi" || memory["maxCount"] != "32Gi" {
		t.Errorf("memory identifier %v, want 2Gi..32Gi default 16Gi", memory)
	}
	if gpu["maxCount"] != int64(4) {
		t.Errorf("accelerator identifier %v, want maxCount 4", gpu)
	}
	wantScheduling := map[string]any{"type": "Queue", "kueue": map[string]any{"localQueueName": "team-a", "priorityClass": "interactive"}}
	if got, want := spec["scheduling"], wantScheduling; !reflect.DeepEqual(got, want) {
		t.Errorf("scheduling:\n got %v\nwant %v", got, want)
	}
}

func TestRenderWithoutExtendedResourceHasNoAccelerator(t *testing.T) {
	p := sharedProfile()
	p.Spec.ExtendedResourceName = nil
	p.Spec.DisplayName, p.Spec.Description = "", ""
	hp, err := Render(p, "ns")
	if err != nil {
		t.Fatal(err)
	}
	ids := hp.Object["spec"].(map[string]any)["identifiers"].([]any)
	if len(ids) != 2 {
		t.Errorf("identifiers %v, want CPU and Memory only", ids)
	}
	if got := hp.GetAnnotations()[DisplayNameAnnotation]; got != "shared-4way" {
		t.Errorf("display name %q, want the profile's name where it has no displayName", got)
	}
}

func TestRenderDisabledOrDeletedProfileIsMarkedDisabled(t *testing.T) {
	disabled := sharedProfile()
	disabled.Spec.Enabled = ptr.To(false)
	deleted := sharedProfile()
	deleted.DeletionTimestamp = ptr.To(metav1.Now())
	for name, p := range map[string]*gpuaas.GpuProfile{"disabled": disabled, "deleted": deleted} {
		hp, err := Render(p, "ns")
		if err != nil {
			t.Fatal(err)
		}
		if got := hp.GetAnnotations()[DisabledAnnotation]; got != "true" {
			t.Errorf("%s profile: %s=%q, want \"true\"", name, DisabledAnnotation, got)
		}
	}
}

func TestRenderRefusesRangesThatDoNotHold(t *testing.T) {
	for name, settings := range map[string]gpuaas.HardwareProfileSettings{
		"default over max":       {CPU: &gpuaas.ResourceRange{Default: quantity("16")}},
		"min over default":       {Memory: &gpuaas.ResourceRange{Min: quantity("16Gi")}},
		"zero min":               {CPU: &gpuaas.ResourceRange{Min: quantity("0")}},
		"priority without queue": {PriorityClass: "high"},
	} {
		p := sharedProfile()
		p.Spec.HardwareProfile = &settings
		if _, err := Render(p, "ns"); err == nil {
			t.Errorf("%s: rendered, want an error", name)
		} else if !strings.Contains(err.Error(), "spec.hardwareProfile") {
			t.Errorf("%s: error %q does not name the field", name, err)
		}
	}
}

func TestNameIsADNSLabelAndKeepsDistinctProfilesApart(t *testing.T) {
	if got := Name("shared-4way"); got != "shared-4way" {
		t.Errorf("Name(shared-4way) = %q, want the profile's own name", got)
	}
	long := strings.Repeat("a", 70) + ".b"
	names := map[string]string{}
	for _, profile := range []string{"mig-1g.10gb", "mig-1g-10gb", "mig-1g_10gb", long, strings.Repeat("a", 70) + ".c"} {
		got := Name(profile)
		if errs := validation.IsDNS1123Label(got); len(errs) > 0 {
			t.Errorf("Name(%q) = %q: %v", profile, got, errs)
		}
		if other, seen := names[got]; seen {
			t.Errorf("Name(%q) = Name(%q) = %q", profile, other, got)
		}
		names[got] = profile
	}
}

func slotShape() *gpuaas.GpuShape {
	return &gpuaas.GpuShape{
		ObjectMeta: metav1.ObjectMeta{Name: "gpu-slot", UID: "uid-shape"},
		Spec: gpuaas.GpuShapeSpec{
			DisplayName: "One H100 and its NIC", Description: "A GPU with the NIC on its PCIe root",
			Requests: []gpuaas.ShapeRequest{{Name: "gpu", Profile: "h100"}, {Name: "nic", DeviceClassName: "nic.example.com"}},
		},
	}
}

// TestRenderShapeNamesItsTemplate: a shape's HardwareProfile has the CPU
// and memory identifiers, no Accelerator (its devices come from the
// template's claim), spec.dra.resourceClaimTemplateName naming the
// template the shape renders (pkg/shape: the shape's name), the given
// scheduling, the shape's display name and description, and the shape as
// its controlling owner.
func TestRenderShapeNamesItsTemplate(t *testing.T) {
	s := slotShape()
	s.Spec.HardwareProfile = &gpuaas.HardwareProfileSettings{Memory: &gpuaas.ResourceRange{Default: quantity("32Gi")}}
	hp, err := RenderShape(s, "team-a", Scheduling{LocalQueue: "gpus", PriorityClass: "batch"})
	if err != nil {
		t.Fatal(err)
	}
	wantSpec := map[string]any{
		"identifiers": []any{
			map[string]any{"displayName": "CPU", "identifier": "cpu", "resourceType": "CPU",
				"minCount": int64(1), "defaultCount": int64(2), "maxCount": int64(8)},
			map[string]any{"displayName": "Memory", "identifier": "memory", "resourceType": "Memory",
				"minCount": "2Gi", "defaultCount": "32Gi", "maxCount": "64Gi"},
		},
		"scheduling": map[string]any{"type": "Queue", "kueue": map[string]any{"localQueueName": "gpus", "priorityClass": "batch"}},
		"dra":        map[string]any{"resourceClaimTemplateName": "gpu-slot"},
	}
	if got := hp.Object["spec"]; !reflect.DeepEqual(got, wantSpec) {
		t.Errorf("spec:\n got %v\nwant %v", got, wantSpec)
	}
	if hp.GetNamespace() != "team-a" || hp.GetName() != "shape-gpu-slot" {
		t.Errorf("rendered %s/%s, want team-a/shape-gpu-slot", hp.GetNamespace(), hp.GetName())
	}
	wantAnnotations := map[string]string{
		DisplayNameAnnotation: "One H100 and its NIC", DescriptionAnnotation: "A GPU with the NIC on its PCIe root",
		DisabledAnnotation: "false", ShapeAnnotation: "gpu-slot",
	}
	if got := hp.GetAnnotations(); !reflect.DeepEqual(got, wantAnnotations) {
		t.Errorf("annotations:\n got %v\nwant %v", got, wantAnnotations)
	}
	refs := hp.GetOwnerReferences()
	if len(refs) != 1 || refs[0].Kind != "GpuShape" || refs[0].UID != "uid-shape" || !ptr.Deref(refs[0].Controller, false) {
		t.Errorf("owner references %+v, want the GpuShape as controller", refs)
	}
	if _, err := RenderShape(&gpuaas.GpuShape{ObjectMeta: metav1.ObjectMeta{Name: "x"}, Spec: gpuaas.GpuShapeSpec{
		HardwareProfile: &gpuaas.HardwareProfileSettings{CPU: &gpuaas.ResourceRange{Min: quantity("4"), Max: quantity("2")}},
	}}, "team-a", Scheduling{}); err == nil || !strings.Contains(err.Error(), "GpuShape x: spec.hardwareProfile.cpu") {
		t.Errorf("ranges that do not hold: %v, want an error naming the shape's cpu range", err)
	}
}

// TestRenderInSchedulesAsGiven: in a tenant's namespace the scheduling is
// the tenant's, not the profile's own localQueueName; a priority class
// without the profile's localQueueName is fine there (the tenant's
// LocalQueue queues it).
func TestRenderInSchedulesAsGiven(t *testing.T) {
	p := sharedProfile()
	p.Spec.HardwareProfile = &gpuaas.HardwareProfileSettings{PriorityClass: "interactive"}
	hp, err := RenderIn(p, "team-a", Scheduling{})
	if err != nil {
		t.Fatal(err)
	}
	if got := hp.Object["spec"].(map[string]any)["scheduling"]; !reflect.DeepEqual(got, map[string]any{"type": "Node"}) {
		t.Errorf("scheduling %v, want Node", got)
	}
	hp, err = RenderIn(p, "team-b", Scheduling{LocalQueue: "gpus", PriorityClass: "interactive"})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"type": "Queue", "kueue": map[string]any{"localQueueName": "gpus", "priorityClass": "interactive"}}
	if got := hp.Object["spec"].(map[string]any)["scheduling"]; !reflect.DeepEqual(got, want) {
		t.Errorf("scheduling %v, want %v", got, want)
	}
	if _, err := Render(p, "global"); err == nil {
		t.Error("Render: a priority class without localQueueName in the global namespace was accepted")
	}
}
