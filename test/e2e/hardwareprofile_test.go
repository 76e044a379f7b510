package e2e

import (
	"context"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/hardwareprofile"
	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

var hardwareProfileGVR = schema.GroupVersionResource{Group: "infrastructure.opendatahub.io", Version: "v1", Resource: "hardwareprofiles"}

// installHardwareProfileCRD installs the test's HardwareProfile CRD
// (testdata/hardwareprofile/crd.yaml, written from the API's documented
// fields) and waits until it is served. It stays installed: the CRD is
// absent from the clusters the other tests model only until a test needs it.
func installHardwareProfileCRD(t *testing.T, ctx context.Context) {
	t.Helper()
	if _, err := cp.Apply(ctx, filepath.Join(repoRoot, "test", "e2e", "testdata", "hardwareprofile"), ""); err != nil {
		t.Fatalf("installing the HardwareProfile CRD: %v", err)
	}
	err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		_, err := cp.Dynamic.Resource(hardwareProfileGVR).List(ctx, metav1.ListOptions{Limit: 1})
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("the HardwareProfile CRD is not served: %v", err)
	}
}

// hardwareProfileCases are GpuProfiles that take every branch of the
// renderer: a shared GPU with its extended resource (the demo catalog's
// shared-4way), a MIG slice without one and a name that is no DNS label, a
// Kueue-scheduled whole GPU with a priority class and the admin's ranges,
// and a disabled profile.
func hardwareProfileCases() []*gpuaas.GpuProfile {
	q := func(s string) *resource.Quantity { return ptr.To(resource.MustParse(s)) }
	return []*gpuaas.GpuProfile{
		{ObjectMeta: metav1.ObjectMeta{Name: "shared-4way"}, Spec: gpuaas.GpuProfileSpec{
			DisplayName: "Shared GPU, 4-way", Description: "A quarter of a GPU's memory",
			Selector: gpuaas.ProfileSelector{Type: gpuaas.DeviceTypeShared}, ExtendedResourceName: ptr.To("gpuaas.io/shared-gpu"),
		}},
		{ObjectMeta: metav1.ObjectMeta{Name: "mig-1g.10gb"}, Spec: gpuaas.GpuProfileSpec{
			DisplayName: "Small MIG slice", Selector: gpuaas.ProfileSelector{MigProfile: "1g.10gb"},
		}},
		{ObjectMeta: metav1.ObjectMeta{Name: "whole-h100"}, Spec: gpuaas.GpuProfileSpec{
			Selector: gpuaas.ProfileSelector{Type: gpuaas.DeviceTypeGPU}, ExtendedResourceName: ptr.To("gpuaas.io/h100"),
			HardwareProfile: &gpuaas.HardwareProfileSettings{
				DisplayName: "Training, whole H100", CPU: &gpuaas.ResourceRange{Min: q("500m"), Default: q("4"), Max: q("32")},
				Memory: &gpuaas.ResourceRange{Default: q("32Gi"), Max: q("256Gi")}, MaxDevices: ptr.To[int32](8),
				LocalQueueName: "team-a", PriorityClass: "batch",
			},
		}},
		{ObjectMeta: metav1.ObjectMeta{Name: "retired"}, Spec: gpuaas.GpuProfileSpec{Enabled: ptr.To(false)}},
	}
}

// TestHardwareProfilesValidateAgainstTheSchema: every object the renderer
// writes is accepted by a HardwareProfile CRD written from the API's
// fields, with strict field validation (an unknown or misplaced field is an
// error, not pruned away), and reads back as written.
func TestHardwareProfilesValidateAgainstTheSchema(t *testing.T) {
	ctx := framework.Context(t, 2*time.Minute)
	installHardwareProfileCRD(t, ctx)
	ns := cp.CreateNamespace(t, "hwp-schema")
	for _, p := range hardwareProfileCases() {
		hp, err := hardwareprofile.Render(p, ns)
		if err != nil {
			t.Fatal(err)
		}
		hp.SetOwnerReferences(nil) // no GpuProfile here: the garbage collector would take it
		created, err := cp.Dynamic.Resource(hardwareProfileGVR).Namespace(ns).Create(ctx, hp, metav1.CreateOptions{FieldValidation: metav1.FieldValidationStrict})
		if err != nil {
			t.Fatalf("HardwareProfile of GpuProfile %s refused: %v", p.Name, err)
		}
		if !reflect.DeepEqual(hp.Object["spec"], created.Object["spec"]) {
			t.Errorf("HardwareProfile %s: spec read back %v, want %v as written", hp.GetName(), created.Object["spec"], hp.Object["spec"])
		}
	}
	// The schema is no rubber stamp: what the dashboard could not read is refused.
	bad, err := hardwareprofile.Render(hardwareProfileCases()[0], ns)
	if err != nil {
		t.Fatal(err)
	}
	bad.SetName("bad")
	bad.SetOwnerReferences(nil)
	bad.Object["spec"].(map[string]any)["scheduling"] = map[string]any{"type": "Queue"}
	_, err = cp.Dynamic.Resource(hardwareProfileGVR).Namespace(ns).Create(ctx, bad, metav1.CreateOptions{FieldValidation: metav1.FieldValidationStrict})
	if err == nil || !strings.Contains(err.Error(), "type Queue takes kueue") {
		t.Fatalf("a Queue HardwareProfile without kueue: %v, want refused by the schema", err)
	}
}
