package catalog_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller/admission"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller/catalog"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller/internal/testworld"
)

// books is the quota books' Accountant over c, which counts the devices
// the reconciler reports.
func books(c client.Client) catalog.Devices {
	return admission.NewAccountant(c, c, admission.NewLedger(c, "gpuaas"))
}

func ctx(t testing.TB) context.Context { return t.Context() }

func reconcileProfile(t *testing.T, c client.Client, name string) *gpuaas.GpuProfile {
	t.Helper()
	r := catalog.NewReconciler(c, books(c), time.Minute, time.Now(), nil)
	if _, err := r.Reconcile(ctx(t), reconcile.Request{NamespacedName: types.NamespacedName{Name: name}}); err != nil {
		t.Fatalf("reconcile: %v", err)
	}
	var p gpuaas.GpuProfile
	if err := c.Get(ctx(t), types.NamespacedName{Name: name}, &p); err != nil {
		t.Fatal(err)
	}
	return &p
}

func readyCondition(t *testing.T, p *gpuaas.GpuProfile) (bool, string, string) {
	t.Helper()
	c := meta.FindStatusCondition(p.Status.Conditions, gpuaas.ConditionReady)
	if c == nil {
		t.Fatal("no Ready condition")
	}
	return c.Status == "True", c.Reason, c.Message
}

func getClass(t *testing.T, c client.Client, name string) *resourceapi.DeviceClass {
	t.Helper()
	var dc resourceapi.DeviceClass
	err := c.Get(ctx(t), types.NamespacedName{Name: name}, &dc)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return &dc
}

func TestProfileReconcilerCreatesClassAndCounts(t *testing.T) {
	p := testworld.GpuProfile("whole", gpuaas.ProfileSelector{Type: "gpu"})
	c := testworld.NewFakeClient(t, append(testworld.World(t), p, testworld.AllocatedTo(testworld.Claim("a", "x", "whole", 1), "node-a", "gpu-2"))...)
	got := reconcileProfile(t, c, "whole")
	if ok, reason, msg := readyCondition(t, got); !ok {
		t.Fatalf("not ready: %s: %s", reason, msg)
	}
	if got.Status.DeviceClassName != "whole" || got.Status.MatchingDevices != 4 || got.Status.AllocatedDevices != 1 || got.Status.FreeDevices != 3 {
		t.Fatalf("status = %+v", got.Status)
	}
	dc := getClass(t, c, "whole")
	if dc == nil || !catalog.OwnedBy(dc, p) {
		t.Fatalf("class = %+v", dc)
	}
}

func TestProfileReconcilerRevertsHandEdits(t *testing.T) {
	c := testworld.NewFakeClient(t, testworld.World(t)...)
	dc := getClass(t, c, "h100")
	dc.Spec.Selectors = dc.Spec.Selectors[:1] // "any device of the driver"
	dc.Labels["team"] = "kept"
	if err := c.Update(ctx(t), dc); err != nil {
		t.Fatal(err)
	}
	reconcileProfile(t, c, "h100")
	after := getClass(t, c, "h100")
	if len(after.Spec.Selectors) != 2 || after.Labels["team"] != "kept" {
		t.Fatalf("class not reverted (or foreign label lost): %+v %v", after.Spec.Selectors, after.Labels)
	}
}

func TestProfileReconcilerInvalidSpecKeepsClass(t *testing.T) {
	c := testworld.NewFakeClient(t, testworld.World(t)...)
	var p gpuaas.GpuProfile
	if err := c.Get(ctx(t), types.NamespacedName{Name: "h100"}, &p); err != nil {
		t.Fatal(err)
	}
	p.Spec.Selector.CEL = "device.attributes["
	if err := c.Update(ctx(t), &p); err != nil {
		t.Fatal(err)
	}
	got := reconcileProfile(t, c, "h100")
	if ok, reason, msg := readyCondition(t, got); ok || reason != gpuaas.ReasonInvalidSpec || !strings.Contains(msg, "spec.selector.cel") {
		t.Fatalf("Ready = %v %s %q", ok, reason, msg)
	}
	if getClass(t, c, "h100") == nil {
		t.Fatal("class of a profile made invalid was removed; claims using it would break")
	}
}

func TestProfileReconcilerConflict(t *testing.T) {
	foreign := &resourceapi.DeviceClass{}
	foreign.Name = "taken"
	c := testworld.NewFakeClient(t, append(testworld.World(t), foreign, testworld.GpuProfile("taken", gpuaas.ProfileSelector{}))...)
	got := reconcileProfile(t, c, "taken")
	if ok, reason, _ := readyCondition(t, got); ok || reason != gpuaas.ReasonDeviceClassConflict {
		t.Fatalf("Ready = %v %s", ok, reason)
	}
	if dc := getClass(t, c, "taken"); len(dc.Spec.Selectors) != 0 {
		t.Fatal("a class the profile does not own was changed")
	}
}

func TestProfileReconcilerDisableDrains(t *testing.T) {
	c := testworld.NewFakeClient(t, append(testworld.World(t), testworld.Claim("a", "user", "h100", 1))...)
	var p gpuaas.GpuProfile
	if err := c.Get(ctx(t), types.NamespacedName{Name: "h100"}, &p); err != nil {
		t.Fatal(err)
	}
	p.Spec.Enabled = ptr.To(false)
	if err := c.Update(ctx(t), &p); err != nil {
		t.Fatal(err)
	}
	got := reconcileProfile(t, c, "h100")
	if _, reason, msg := readyCondition(t, got); reason != gpuaas.ReasonDraining || !strings.Contains(msg, "a/user") {
		t.Fatalf("Ready reason %s %q, want Draining naming the claim", reason, msg)
	}
	if getClass(t, c, "h100") == nil {
		t.Fatal("class removed while a claim uses it")
	}
	if err := c.Delete(ctx(t), testworld.Claim("a", "user", "h100", 1)); err != nil {
		t.Fatal(err)
	}
	got = reconcileProfile(t, c, "h100")
	if _, reason, _ := readyCondition(t, got); reason != gpuaas.ReasonDisabled || getClass(t, c, "h100") != nil {
		t.Fatalf("Ready reason %s, class still there: %v", reason, getClass(t, c, "h100") != nil)
	}
}

// Issue 12 item 12: deleting a GpuProfile garbage-collected its class at
// once (owner reference), stranding pending claims; disabling drained it.
// Deletion now drains the same way: the finalizer holds the profile, the
// class stays while a claim names it, then both go.
func TestProfileReconcilerDeleteDrains(t *testing.T) {
	c := testworld.NewFakeClient(t, append(testworld.World(t), testworld.Claim("a", "user", "h100", 1))...)
	r := catalog.NewReconciler(c, books(c), time.Minute, time.Now(), nil)
	reconcileWith(t, r, "h100")
	var p gpuaas.GpuProfile
	if err := c.Get(ctx(t), types.NamespacedName{Name: "h100"}, &p); err != nil {
		t.Fatal(err)
	}
	if !controllerutil.ContainsFinalizer(&p, gpuaas.DrainFinalizer) {
		t.Fatal("no drain finalizer on the profile")
	}
	if err := c.Delete(ctx(t), &p); err != nil {
		t.Fatal(err)
	}
	reconcileWith(t, r, "h100")
	if err := c.Get(ctx(t), types.NamespacedName{Name: "h100"}, &p); err != nil {
		t.Fatalf("profile gone while a claim names its class: %v", err)
	}
	if _, reason, msg := readyCondition(t, &p); reason != gpuaas.ReasonDraining || !strings.Contains(msg, "profile deleted") {
		t.Fatalf("Ready %s %q, want Draining", reason, msg)
	}
	if getClass(t, c, "h100") == nil {
		t.Fatal("class removed while a claim uses it")
	}
	if err := c.Delete(ctx(t), testworld.Claim("a", "user", "h100", 1)); err != nil {
		t.Fatal(err)
	}
	reconcileWith(t, r, "h100")
	if err := c.Get(ctx(t), types.NamespacedName{Name: "h100"}, &p); !apierrors.IsNotFound(err) {
		t.Fatalf("drained profile still there: %v", err)
	}
	if getClass(t, c, "h100") != nil {
		t.Fatal("class of the drained profile still there")
	}
}

// The chart's uninstall hook releases every profile: the finalizer goes,
// and the controller that still runs until helm deletes it does not add it
// back; a controller started later (a reinstall) does.
func TestReleasedProfileGetsNoFinalizerUntilTheNextController(t *testing.T) {
	c := testworld.NewFakeClient(t, testworld.World(t)...)
	acct := books(c)
	running := catalog.NewReconciler(c, acct, time.Minute, time.Now().Add(-time.Hour), nil)
	reconcileWith(t, running, "h100")
	if n, err := catalog.ReleaseFinalizersAt(ctx(t), c, time.Now()); err != nil || n != 2 {
		t.Fatalf("released %d profiles: %v", n, err)
	}
	reconcileWith(t, running, "h100")
	var p gpuaas.GpuProfile
	if err := c.Get(ctx(t), types.NamespacedName{Name: "h100"}, &p); err != nil {
		t.Fatal(err)
	}
	if controllerutil.ContainsFinalizer(&p, gpuaas.DrainFinalizer) {
		t.Fatal("the running controller added the finalizer back after the release")
	}
	next := catalog.NewReconciler(c, acct, time.Minute, time.Now().Add(time.Hour), nil)
	reconcileWith(t, next, "h100")
	if err := c.Get(ctx(t), types.NamespacedName{Name: "h100"}, &p); err != nil {
		t.Fatal(err)
	}
	if !controllerutil.ContainsFinalizer(&p, gpuaas.DrainFinalizer) || p.Annotations[gpuaas.ReleasedAnnotation] != "" {
		t.Fatalf("a later controller did not take the profile back: finalizers %v, annotations %v", p.Finalizers, p.Annotations)
	}
}

func reconcileWith(t *testing.T, r *catalog.Reconciler, name string) {
	t.Helper()
	if _, err := r.Reconcile(ctx(t), reconcile.Request{NamespacedName: types.NamespacedName{Name: name}}); err != nil {
		t.Fatalf("reconcile: %v", err)
	}
}

// A whole GPU offered with dynamic MIG is not free while one of its MIG
// partitions is allocated: both consume the GPU's counters, and the
// scheduler cannot give it. The free count said matching - allocated.
func TestProfileFreeCountHonoursCounters(t *testing.T) {
	counters := func(slices int64) []resourceapi.DeviceCounterConsumption {
		return []resourceapi.DeviceCounterConsumption{{CounterSet: "gpu-0-counters",
			Counters: map[string]resourceapi.Counter{"memory-slices": {Value: *resource.NewQuantity(slices, resource.DecimalSI)}}}}
	}
	whole := testworld.WholeGPU(0)
	whole.Attributes["index"] = resourceapi.DeviceAttribute{IntValue: ptr.To[int64](0)}
	whole.ConsumesCounters = counters(7)
	part := testworld.Mig1g(0)
	part.Attributes["index"] = resourceapi.DeviceAttribute{IntValue: ptr.To[int64](0)}
	part.ConsumesCounters = counters(1)
	set := testworld.ResourceSlice("node-m")
	set.Name = "node-m-counters"
	set.Spec.Pool.ResourceSliceCount = 2
	set.Spec.SharedCounters = []resourceapi.CounterSet{{Name: "gpu-0-counters",
		Counters: map[string]resourceapi.Counter{"memory-slices": {Value: *resource.NewQuantity(7, resource.DecimalSI)}}}}
	devs := testworld.ResourceSlice("node-m", whole, part)
	devs.Spec.Pool.ResourceSliceCount = 2
	p := testworld.GpuProfile("whole", gpuaas.ProfileSelector{Type: "gpu"})
	objs := append(testworld.World(t)[:4], p, set, devs, testworld.AllocatedTo(testworld.Claim("a", "small", "mig-1g", 1), "node-m", part.Name))
	got := reconcileProfile(t, testworld.NewFakeClient(t, objs...), "whole")
	if got.Status.MatchingDevices != 1 || got.Status.AllocatedDevices != 0 || got.Status.FreeDevices != 0 {
		t.Fatalf("status = matching %d, allocated %d, free %d; want 1, 0, 0 (its MIG partition is taken)",
			got.Status.MatchingDevices, got.Status.AllocatedDevices, got.Status.FreeDevices)
	}
}

// The profile controller takes the name off the list before it creates the
// class, and creates nothing when it cannot.
func TestProfileReconcilerExcludesBeforeCreatingClass(t *testing.T) {
	p := testworld.GpuProfile("whole", gpuaas.ProfileSelector{Type: "gpu"})
	c := testworld.NewFakeClient(t, append(testworld.World(t), p)...)
	var excluded []string
	fail := true
	r := catalog.NewReconciler(c, books(c), time.Minute, time.Now(),
		func(ctx context.Context, class string) error {
			var dc resourceapi.DeviceClass
			if err := c.Get(ctx, types.NamespacedName{Name: class}, &dc); err == nil {
				t.Errorf("class %s exists before it was excluded", class)
			}
			excluded = append(excluded, class)
			if fail {
				return errors.New("apiserver away")
			}
			return nil
		})
	req := reconcile.Request{NamespacedName: client.ObjectKey{Name: "whole"}}
	if _, err := r.Reconcile(ctx(t), req); err == nil {
		t.Fatal("reconciled although the exclusion failed")
	}
	if getClass(t, c, "whole") != nil {
		t.Fatal("class created although the exclusion failed")
	}
	fail = false
	if _, err := r.Reconcile(ctx(t), req); err != nil {
		t.Fatal(err)
	}
	if getClass(t, c, "whole") == nil || strings.Join(excluded, ",") != "whole,whole" {
		t.Fatalf("class %v, excluded %v", getClass(t, c, "whole"), excluded)
	}
}

// A write the API server refuses because the reconciler read a cache that
// was behind (the class it created a moment ago not yet in it, the profile
// or class changed since) is no reconcile error: the newer object's event,
// or the requeue, reconciles again. Counted as errors, these set off
// GpuaasControllerReconcileErrors in every `make demo`. A refusal of
// another kind is still an error.
func TestACacheBehindTheAPIServerIsNoReconcileError(t *testing.T) {
	conflict := apierrors.NewConflict(resourceapi.Resource("deviceclasses"), "whole", errors.New("the object has been modified"))
	exists := apierrors.NewAlreadyExists(resourceapi.Resource("deviceclasses"), "whole")
	profileConflict := apierrors.NewConflict(schema.GroupResource{Group: gpuaas.GroupName, Resource: "gpuprofiles"}, "whole", errors.New("the object has been modified"))
	forbidden := apierrors.NewForbidden(resourceapi.Resource("deviceclasses"), "whole", errors.New("no"))
	for _, tc := range []struct {
		name    string
		funcs   func(refusal error) interceptor.Funcs
		refusal error
		isError bool
	}{
		{"class created meanwhile", createRefused, exists, false},
		{"class changed meanwhile", updateRefused, conflict, false},
		{"profile changed before its finalizer", patchRefused, profileConflict, false},
		{"class creation forbidden", createRefused, forbidden, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := testworld.GpuProfile("whole", gpuaas.ProfileSelector{Type: "gpu"})
			objs := append(testworld.World(t), p)
			if tc.name == "class changed meanwhile" {
				seed := testworld.NewFakeClient(t, objs...)
				reconcileProfile(t, seed, "whole")
				dc := getClass(t, seed, "whole")
				dc.Spec.Selectors = nil // a hand edit the reconciler reverts
				dc.ResourceVersion = ""
				objs = append(objs, dc)
				p.Finalizers = []string{gpuaas.DrainFinalizer}
			}
			c := interceptor.NewClient(testworld.NewFakeClient(t, objs...), tc.funcs(tc.refusal))
			r := catalog.NewReconciler(c, books(c), time.Minute, time.Now(), nil)
			res, err := r.Reconcile(ctx(t), reconcile.Request{NamespacedName: types.NamespacedName{Name: "whole"}})
			if tc.isError {
				if err == nil {
					t.Fatal("a forbidden class creation was no error")
				}
				return
			}
			if err != nil {
				t.Fatalf("a cache behind the API server (%v) was a reconcile error: %v", tc.refusal, err)
			}
			if res.RequeueAfter <= 0 {
				t.Fatalf("not requeued: %+v", res)
			}
			var got gpuaas.GpuProfile
			if err := c.Get(ctx(t), types.NamespacedName{Name: "whole"}, &got); err != nil {
				t.Fatal(err)
			}
			if cond := meta.FindStatusCondition(got.Status.Conditions, gpuaas.ConditionReady); cond != nil && cond.Reason == gpuaas.ReasonApplyFailed {
				t.Fatalf("the profile reports %s: %s", cond.Reason, cond.Message)
			}
		})
	}
}

func createRefused(refusal error) interceptor.Funcs {
	return interceptor.Funcs{Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
		if _, ok := obj.(*resourceapi.DeviceClass); ok {
			return refusal
		}
		return c.Create(ctx, obj, opts...)
	}}
}

func updateRefused(refusal error) interceptor.Funcs {
	return interceptor.Funcs{Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
		if _, ok := obj.(*resourceapi.DeviceClass); ok {
			return refusal
		}
		return c.Update(ctx, obj, opts...)
	}}
}

func patchRefused(refusal error) interceptor.Funcs {
	return interceptor.Funcs{Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
		if _, ok := obj.(*gpuaas.GpuProfile); ok {
			return refusal
		}
		return c.Patch(ctx, obj, patch, opts...)
	}}
}
