package hardwareprofiles

import (
	"context"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller/internal/testworld"
	"github.com/gpuaas/gpu-dra-driver/pkg/hardwareprofile"
)

const namespace = "redhat-ods-applications"

const resync = 30 * time.Second

// world is a reconciler over a fake API whose mapper serves the
// HardwareProfile kind only once install is called, and that counts the
// requests made for HardwareProfiles.
type world struct {
	r        *Reconciler
	client   client.Client
	mapper   *meta.DefaultRESTMapper
	requests int
	// listed is how many HardwareProfiles Lists returned, writes how
	// many were created, updated or deleted, queueLists how many Lists of
	// LocalQueues were made.
	listed, writes, queueLists int
	// now is the reconciler's clock.
	now time.Time
}

func newWorld(t *testing.T, objs ...client.Object) *world {
	t.Helper()
	s := runtime.NewScheme()
	if err := gpuaas.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	w := &world{mapper: meta.NewDefaultRESTMapper(nil)}
	w.mapper.Add(gpuaas.GroupVersion.WithKind(gpuaas.GpuProfileKind), meta.RESTScopeRoot)
	w.mapper.Add(gpuaas.GroupVersion.WithKind(gpuaas.GpuShapeKind), meta.RESTScopeRoot)
	w.mapper.Add(gpuaas.GroupVersion.WithKind("TenantQuota"), meta.RESTScopeRoot)
	count := func(obj client.Object) {
		if obj.GetObjectKind().GroupVersionKind() == hardwareprofile.GroupVersionKind {
			w.requests++
		}
	}
	write := func(obj client.Object) {
		if obj.GetObjectKind().GroupVersionKind() == hardwareprofile.GroupVersionKind {
			w.writes++
		}
	}
	w.client = fake.NewClientBuilder().WithScheme(s).WithRESTMapper(w.mapper).WithObjects(objs...).
		WithStatusSubresource(&gpuaas.GpuProfile{}, &gpuaas.GpuShape{}, &gpuaas.TenantQuota{}).
		WithInterceptorFuncs(interceptor.Funcs{
			Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
				count(obj)
				return c.Get(ctx, key, obj, opts...)
			},
			Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
				count(obj)
				write(obj)
				return c.Create(ctx, obj, opts...)
			},
			Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
				count(obj)
				write(obj)
				return c.Update(ctx, obj, opts...)
			},
			Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
				write(obj)
				return c.Delete(ctx, obj, opts...)
			},
			List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
				err := c.List(ctx, list, opts...)
				l, ok := list.(*unstructured.UnstructuredList)
				switch {
				case ok && l.GetKind() == hardwareprofile.GroupVersionKind.Kind+"List":
					w.listed += len(l.Items)
				case ok && l.GetKind() == "LocalQueueList":
					w.queueLists++
				}
				return err
			},
		}).Build()
	w.r = &Reconciler{Client: w.client, Direct: w.client, Mapper: w.mapper, Namespace: namespace, Resync: resync}
	w.now = time.Date(2026, 12, 2, 8, 0, 0, 0, time.UTC)
	w.r.queues.now = func() time.Time { return w.now }
	return w
}

// install serves the HardwareProfile kind, as installing the
// opendatahub-operator's CRD does.
func (w *world) install() {
	w.mapper.Add(hardwareprofile.GroupVersionKind, meta.RESTScopeNamespace)
}

func (w *world) reconcile(t *testing.T, profile string) reconcile.Result {
	t.Helper()
	res, err := ProfileReconciler{w.r}.Reconcile(t.Context(), reconcile.Request{NamespacedName: client.ObjectKey{Name: profile}})
	if err != nil {
		t.Fatalf("reconciling %s: %v", profile, err)
	}
	return res
}

func (w *world) hardwareProfile(t *testing.T, name string) *unstructured.Unstructured {
	t.Helper()
	return w.hardwareProfileIn(t, namespace, name)
}

func sharedProfile() *gpuaas.GpuProfile {
	p := testworld.GpuProfile("shared-4way", gpuaas.ProfileSelector{Type: gpuaas.DeviceTypeShared})
	p.Spec.DisplayName = "Shared GPU, 4-way"
	p.Spec.ExtendedResourceName = ptr.To("gpuaas.io/shared-gpu")
	return p
}

func TestNothingIsWrittenUntilTheCRDIsServedThenTheProfileIsPublished(t *testing.T) {
	w := newWorld(t, sharedProfile())
	if res := w.reconcile(t, "shared-4way"); res.RequeueAfter != resync {
		t.Errorf("without the CRD: requeue after %v, want the resync %v (a later install is picked up then)", res.RequeueAfter, resync)
	}
	if w.requests != 0 {
		t.Fatalf("without the CRD: %d HardwareProfile requests, want none", w.requests)
	}

	w.install()
	w.reconcile(t, "shared-4way")
	hp := w.hardwareProfile(t, "shared-4way")
	refs := hp.GetOwnerReferences()
	if len(refs) != 1 || refs[0].UID != "uid-shared-4way" || refs[0].Kind != gpuaas.GpuProfileKind {
		t.Errorf("owner references %+v, want the GpuProfile's (garbage collection takes it with the profile)", refs)
	}
	if got := hp.GetAnnotations()[hardwareprofile.DisplayNameAnnotation]; got != "Shared GPU, 4-way" {
		t.Errorf("display name %q, want the profile's", got)
	}
	ids, _, _ := unstructured.NestedSlice(hp.Object, "spec", "identifiers")
	if len(ids) != 3 {
		t.Errorf("identifiers %v, want CPU, Memory and the accelerator", ids)
	}
}

func TestHandEditsArePutBackAndTheDashboardsOwnFieldsStay(t *testing.T) {
	w := newWorld(t, sharedProfile())
	w.install()
	w.reconcile(t, "shared-4way")
	hp := w.hardwareProfile(t, "shared-4way")
	want := hp.DeepCopy()

	annotations := hp.GetAnnotations()
	annotations[hardwareprofile.DisabledAnnotation] = "true"
	annotations["opendatahub.io/dashboard-feature-visibility"] = `["workbench"]`
	hp.SetAnnotations(annotations)
	if err := unstructured.SetNestedSlice(hp.Object, []any{}, "spec", "identifiers"); err != nil {
		t.Fatal(err)
	}
	if err := unstructured.SetNestedField(hp.Object, "Queue", "spec", "scheduling", "type"); err != nil {
		t.Fatal(err)
	}
	if err := w.client.Update(t.Context(), hp); err != nil {
		t.Fatal(err)
	}

	w.reconcile(t, "shared-4way")
	got := w.hardwareProfile(t, "shared-4way")
	for _, field := range []string{"identifiers", "scheduling"} {
		a, _, _ := unstructured.NestedFieldNoCopy(got.Object, "spec", field)
		b, _, _ := unstructured.NestedFieldNoCopy(want.Object, "spec", field)
		if !equalJSON(a, b) {
			t.Errorf("spec.%s %v, want %v put back", field, a, b)
		}
	}
	if v := got.GetAnnotations()[hardwareprofile.DisabledAnnotation]; v != "false" {
		t.Errorf("%s=%q, want \"false\" put back", hardwareprofile.DisabledAnnotation, v)
	}
	if _, kept := got.GetAnnotations()["opendatahub.io/dashboard-feature-visibility"]; !kept {
		t.Error("the admin's dashboard-feature-visibility annotation was dropped")
	}
}

func TestADisabledProfileIsPublishedDisabled(t *testing.T) {
	p := sharedProfile()
	p.Spec.Enabled = ptr.To(false)
	w := newWorld(t, p)
	w.install()
	w.reconcile(t, "shared-4way")
	if got := w.hardwareProfile(t, "shared-4way").GetAnnotations()[hardwareprofile.DisabledAnnotation]; got != "true" {
		t.Errorf("%s=%q, want \"true\"", hardwareprofile.DisabledAnnotation, got)
	}
}

func TestAnAdminsOwnHardwareProfileOfTheSameNameIsLeftAlone(t *testing.T) {
	theirs := &unstructured.Unstructured{}
	theirs.SetGroupVersionKind(hardwareprofile.GroupVersionKind)
	theirs.SetNamespace(namespace)
	theirs.SetName("shared-4way")
	theirs.Object["spec"] = map[string]any{"identifiers": []any{}}
	w := newWorld(t, sharedProfile())
	w.install()
	if err := w.client.Create(t.Context(), theirs); err != nil {
		t.Fatal(err)
	}
	w.reconcile(t, "shared-4way")
	c := w.profileCondition(t, "shared-4way")
	if c == nil || c.Status != metav1.ConditionFalse || !strings.Contains(c.Message, "is not GpuProfile shared-4way's") {
		t.Fatalf("condition %+v, want HardwareProfilesPublished False saying the HardwareProfile is not the profile's", c)
	}
	ids, _, _ := unstructured.NestedSlice(w.hardwareProfile(t, "shared-4way").Object, "spec", "identifiers")
	if len(ids) != 0 {
		t.Errorf("the admin's HardwareProfile was overwritten: identifiers %v", ids)
	}
}

func TestSettingsThatDoNotHoldPublishNothing(t *testing.T) {
	p := sharedProfile()
	p.Spec.HardwareProfile = &gpuaas.HardwareProfileSettings{PriorityClass: "high"}
	w := newWorld(t, p)
	w.install()
	w.reconcile(t, "shared-4way")
	hp := &unstructured.Unstructured{}
	hp.SetGroupVersionKind(hardwareprofile.GroupVersionKind)
	err := w.client.Get(t.Context(), client.ObjectKey{Namespace: namespace, Name: "shared-4way"}, hp)
	if err == nil {
		t.Fatal("a HardwareProfile was published from settings that do not hold")
	}
}

// equalJSON compares two values as JSON: the fake client's round trip
// turns the renderer's int64 into float64 or int64 alike.
func equalJSON(a, b any) bool {
	ua := &unstructured.Unstructured{Object: map[string]any{"v": a}}
	ub := &unstructured.Unstructured{Object: map[string]any{"v": b}}
	ja, errA := ua.MarshalJSON()
	jb, errB := ub.MarshalJSON()
	return errA == nil && errB == nil && string(ja) == string(jb)
}
