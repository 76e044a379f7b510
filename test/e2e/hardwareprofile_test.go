package e2e

import (
	"context"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller"
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

// hardwareProfileShape is a GpuShape with the admin's ranges: a GPU and
// another driver's NIC.
func hardwareProfileShape() *gpuaas.GpuShape {
	return &gpuaas.GpuShape{ObjectMeta: metav1.ObjectMeta{Name: "gpu-slot"}, Spec: gpuaas.GpuShapeSpec{
		DisplayName: "One GPU and its NIC",
		Requests:    []gpuaas.ShapeRequest{{Name: "gpu", Profile: "whole-h100"}, {Name: "nic", DeviceClassName: "nic.example.com"}},
		HardwareProfile: &gpuaas.HardwareProfileSettings{
			CPU: &gpuaas.ResourceRange{Default: ptr.To(resource.MustParse("4"))},
		},
	}}
}

// TestHardwareProfilesValidateAgainstTheSchema: every object the renderer
// writes is accepted by a HardwareProfile CRD written from the API's
// fields, with strict field validation (an unknown or misplaced field is an
// error, not pruned away), and reads back as written.
func TestHardwareProfilesValidateAgainstTheSchema(t *testing.T) {
	ctx := framework.Context(t, 2*time.Minute)
	installHardwareProfileCRD(t, ctx)
	ns := cp.CreateNamespace(t, "hwp-schema")
	var rendered []*unstructured.Unstructured
	for _, p := range hardwareProfileCases() {
		hp, err := hardwareprofile.Render(p, ns)
		if err != nil {
			t.Fatal(err)
		}
		rendered = append(rendered, hp)
	}
	// A profile in a Kueue-managed tenant's namespace, and shapes (their
	// template named in spec.dra), Node- and Queue-scheduled.
	inTenant, err := hardwareprofile.RenderIn(hardwareProfileCases()[1], ns, hardwareprofile.Scheduling{LocalQueue: "gpus", PriorityClass: "batch"})
	if err != nil {
		t.Fatal(err)
	}
	inTenant.SetName("in-tenant")
	rendered = append(rendered, inTenant)
	for _, sched := range []hardwareprofile.Scheduling{{}, {LocalQueue: "gpus"}} {
		hp, err := hardwareprofile.RenderShape(hardwareProfileShape(), ns, sched)
		if err != nil {
			t.Fatal(err)
		}
		if sched.LocalQueue != "" {
			hp.SetName("gpu-slot-queued")
		}
		rendered = append(rendered, hp)
	}
	for _, hp := range rendered {
		hp.SetOwnerReferences(nil) // no GpuProfile here: the garbage collector would take it
		created, err := cp.Dynamic.Resource(hardwareProfileGVR).Namespace(ns).Create(ctx, hp, metav1.CreateOptions{FieldValidation: metav1.FieldValidationStrict})
		if err != nil {
			t.Fatalf("HardwareProfile %s refused: %v", hp.GetName(), err)
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

// TestControllerPublishesHardwareProfiles (issue 54): with
// --hardware-profile-namespace the controller publishes a GpuProfile as a
// HardwareProfile once the CRD is installed (here after the controller
// started, when it runs alone), owned by the profile; a hand edit is put
// back, disabling the profile marks it disabled, and deleting the profile
// takes it with it (the garbage collector, through the owner reference).
func TestControllerPublishesHardwareProfiles(t *testing.T) {
	ctx := framework.Context(t, 3*time.Minute)
	ns := cp.CreateNamespace(t, "hwp")
	startControllerWith(t, func(o *controller.Options) { o.HardwareProfileNamespace = ns })
	p := hardwareProfileCases()[0].DeepCopy()
	p.Name = uniqueName("shared")
	createObject(t, p)
	waitForProfileReady(t, p.Name)
	installHardwareProfileCRD(t, ctx)

	hps := cp.Dynamic.Resource(hardwareProfileGVR).Namespace(ns)
	published := waitForHardwareProfile(t, ctx, ns, hardwareprofile.Name(p.Name), "published", func(hp *unstructured.Unstructured) bool { return true })
	live := &gpuaas.GpuProfile{}
	if err := ctrlClient.Get(ctx, client.ObjectKey{Name: p.Name}, live); err != nil {
		t.Fatal(err)
	}
	want, err := hardwareprofile.Render(live, ns)
	if err != nil {
		t.Fatal(err)
	}
	if refs := published.GetOwnerReferences(); len(refs) != 1 || refs[0].UID != live.UID {
		t.Errorf("owner references %+v, want GpuProfile %s's (uid %s)", refs, p.Name, live.UID)
	}
	if !reflect.DeepEqual(published.Object["spec"], want.Object["spec"]) {
		t.Errorf("spec %v, want %v", published.Object["spec"], want.Object["spec"])
	}

	edited := published.DeepCopy()
	annotations := edited.GetAnnotations()
	annotations[hardwareprofile.DisabledAnnotation] = "true"
	edited.SetAnnotations(annotations)
	edited.Object["spec"].(map[string]any)["identifiers"] = []any{}
	if _, err := hps.Update(ctx, edited, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitForHardwareProfile(t, ctx, ns, hardwareprofile.Name(p.Name), "put back", func(hp *unstructured.Unstructured) bool {
		return hp.GetAnnotations()[hardwareprofile.DisabledAnnotation] == "false" && reflect.DeepEqual(hp.Object["spec"], want.Object["spec"])
	})
	waitForProfile(t, p.Name, "saying where it is published", func(p *gpuaas.GpuProfile) bool {
		c := findCondition(p.Status.Conditions, gpuaas.ConditionHardwareProfilesPublished)
		return len(p.Status.HardwareProfileNamespaces) == 1 && p.Status.HardwareProfileNamespaces[0] == ns && c != nil && c.Status == metav1.ConditionTrue
	})

	// The controller writes the profile's status meanwhile (where it is
	// published): a plain Update of the copy read above conflicts.
	updateObject(t, ctx, live, func(p *gpuaas.GpuProfile) { p.Spec.Enabled = ptr.To(false) })
	waitForHardwareProfile(t, ctx, ns, hardwareprofile.Name(p.Name), "disabled", func(hp *unstructured.Unstructured) bool {
		return hp.GetAnnotations()[hardwareprofile.DisabledAnnotation] == "true"
	})

	if err := ctrlClient.Delete(ctx, live); err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		_, err := hps.Get(ctx, hardwareprofile.Name(p.Name), metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		t.Fatalf("HardwareProfile %s/%s still there after its GpuProfile was deleted: %v", ns, p.Name, err)
	}
}

// waitForHardwareProfile waits until the HardwareProfile name (a
// GpuProfile's hardwareprofile.Name, a GpuShape's ShapeName) in ns exists
// and meets cond.
func waitForHardwareProfile(t *testing.T, ctx context.Context, ns, name, what string, cond func(*unstructured.Unstructured) bool) *unstructured.Unstructured {
	t.Helper()
	var hp *unstructured.Unstructured
	err := wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		var err error
		hp, err = cp.Dynamic.Resource(hardwareProfileGVR).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		return cond(hp), nil
	})
	if err != nil {
		t.Fatalf("HardwareProfile %s/%s not %s: %v; last %v", ns, name, what, err, hp)
	}
	return hp
}

// TestControllerPublishesShapeHardwareProfiles (issue 54): a GpuShape is
// published as a HardwareProfile in each of its tenants' namespaces that
// holds its ResourceClaimTemplate, naming that template
// (spec.dra.resourceClaimTemplateName), accepted by the CRD's schema, owned
// by the shape; the shape's status says where; a hand edit of the template
// name is put back; a namespace the tenant drops loses it; deleting the
// shape takes the rest (the garbage collector).
func TestControllerPublishesShapeHardwareProfiles(t *testing.T) {
	ctx := framework.Context(t, 3*time.Minute)
	installHardwareProfileCRD(t, ctx)
	startControllerWith(t, func(o *controller.Options) { o.HardwareProfilesPerTenant = true })
	// The profile is published per tenant too, beside the shape's
	// (shape-<name>).
	name := uniqueName("hwp-slot")
	hpName := hardwareprofile.ShapeName(name)
	part := name + "-gpu"
	createObject(t, profile(part, gpuaas.ProfileSelector{Type: gpuaas.DeviceTypeGPU}))
	waitForProfileReady(t, part)
	ns1, ns2 := cp.CreateNamespace(t, "hwp-shape"), cp.CreateNamespace(t, "hwp-shape")
	q := quotaFor(name, []string{ns1, ns2}, gpuaas.QuotaLimits{})
	createObject(t, q)
	shape := &gpuaas.GpuShape{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: gpuaas.GpuShapeSpec{
		DisplayName: "One GPU", Requests: []gpuaas.ShapeRequest{{Name: "gpu", Profile: part}}, Tenants: []string{name},
	}}
	createObject(t, shape)

	for _, ns := range []string{ns1, ns2} {
		hp := waitForHardwareProfile(t, ctx, ns, hpName, "published", func(*unstructured.Unstructured) bool { return true })
		if tmpl, _, _ := unstructured.NestedString(hp.Object, "spec", "dra", "resourceClaimTemplateName"); tmpl != name {
			t.Errorf("%s: spec.dra.resourceClaimTemplateName %q, want the shape's template %s", ns, tmpl, name)
		}
		if kind, _, _ := unstructured.NestedString(hp.Object, "spec", "scheduling", "type"); kind != "Node" {
			t.Errorf("%s: scheduling %q, want Node (the tenant is not Kueue-managed)", ns, kind)
		}
		if refs := hp.GetOwnerReferences(); len(refs) != 1 || refs[0].Kind != gpuaas.GpuShapeKind || refs[0].Name != name {
			t.Errorf("%s: owner references %+v, want the GpuShape's", ns, refs)
		}
		if got := getTemplate(t, ctx, ns, name); got == nil {
			t.Errorf("%s: HardwareProfile published where the shape's template is not", ns)
		}
	}
	waitForShape(t, name, "published in both namespaces", func(s *gpuaas.GpuShape) bool {
		c := findCondition(s.Status.Conditions, gpuaas.ConditionHardwareProfilesPublished)
		return len(s.Status.HardwareProfileNamespaces) == 2 && c != nil && c.Status == metav1.ConditionTrue
	})

	hps := cp.Dynamic.Resource(hardwareProfileGVR).Namespace(ns1)
	edited, err := hps.Get(ctx, hpName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := unstructured.SetNestedField(edited.Object, "someone-elses", "spec", "dra", "resourceClaimTemplateName"); err != nil {
		t.Fatal(err)
	}
	if _, err := hps.Update(ctx, edited, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitForHardwareProfile(t, ctx, ns1, hpName, "put back", func(hp *unstructured.Unstructured) bool {
		tmpl, _, _ := unstructured.NestedString(hp.Object, "spec", "dra", "resourceClaimTemplateName")
		return tmpl == name
	})

	updateObject(t, ctx, q, func(q *gpuaas.TenantQuota) { q.Spec.Namespaces = []string{ns1} })
	err = wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		_, err := cp.Dynamic.Resource(hardwareProfileGVR).Namespace(ns2).Get(ctx, hpName, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		t.Fatalf("HardwareProfile %s/%s still there after the tenant dropped the namespace: %v", ns2, hpName, err)
	}

	if err := ctrlClient.Delete(ctx, shape); err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		_, err := hps.Get(ctx, hpName, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		t.Fatalf("HardwareProfile %s/%s still there after its GpuShape was deleted: %v", ns1, hpName, err)
	}
}
