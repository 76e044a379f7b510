package controller

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller/billingreaders"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller/internal/testworld"
	"github.com/gpuaas/gpu-dra-driver/pkg/quota"
)

// TestCacheHoldsOnlyOurSlices (issue 52): the manager's cache, which every
// replica runs for the webhook, lists ResourceSlices with a spec.driver
// field selector, so another driver's slices (500 of them took the
// controller from 81 MB to 171 MB) never reach it. Before, it held every
// slice of every driver.
func TestCacheHoldsOnlyOurSlices(t *testing.T) {
	opts := cacheOptions(nil)
	bo, ok := byObject[*resourceapi.ResourceSlice](opts)
	if !ok || bo.Field == nil {
		t.Fatal("the cache lists every driver's ResourceSlices: no field selector")
	}
	if !bo.Field.Matches(fields.Set{"spec.driver": quota.DriverName}) {
		t.Errorf("selector %q leaves out our own slices", bo.Field)
	}
	if bo.Field.Matches(fields.Set{"spec.driver": "gpu.example.com"}) {
		t.Errorf("selector %q lets another driver's slices in", bo.Field)
	}
}

// TestCacheStripsManagedFields: no reader of the cache reads managedFields,
// often the largest part of a small object; every kind is cached without
// them (an update of an object read from the cache, sent without them,
// leaves the server's as they are).
func TestCacheStripsManagedFields(t *testing.T) {
	opts := cacheOptions(nil)
	if opts.DefaultTransform == nil {
		t.Fatal("no default transform: managedFields are cached for every kind")
	}
	managed := []metav1.ManagedFieldsEntry{{Manager: "kubelet", Operation: metav1.ManagedFieldsOperationApply}}
	for _, obj := range []client.Object{
		testworld.ResourceSlice("node-a", testworld.WholeGPU(0)),
		testworld.Claim("a", "c", "h100", 1),
		testworld.Namespace("a", nil),
		testworld.TeamQuota("q", "a", "1"),
		testworld.GpuProfile("h100", gpuaas.ProfileSelector{}),
		&corev1.Secret{},
	} {
		obj.SetManagedFields(managed)
		out, err := opts.DefaultTransform(obj)
		if err != nil {
			t.Fatalf("%T: %v", obj, err)
		}
		if got := out.(client.Object).GetManagedFields(); got != nil {
			t.Errorf("%T cached with managedFields %v", obj, got)
		}
	}
}

// byObject is the cache's options for the kind T.
func byObject[T client.Object](opts cache.Options) (cache.ByObject, bool) {
	for obj, bo := range opts.ByObject {
		if _, ok := obj.(T); ok {
			return bo, true
		}
	}
	return cache.ByObject{}, false
}

// The cache holds the billing readers' ClusterRoles and bindings only,
// by their label, not the cluster's hundreds.
func TestCacheHoldsOnlyTheBillingReadersRoles(t *testing.T) {
	opts := cacheOptions(nil)
	for _, bo := range []func(cache.Options) (cache.ByObject, bool){byObject[*rbacv1.ClusterRole], byObject[*rbacv1.ClusterRoleBinding]} {
		got, ok := bo(opts)
		if !ok || got.Label == nil || got.Label.String() != billingreaders.Label+"=true" {
			t.Errorf("cache of ClusterRoles/Bindings: %+v (set %v), want label %s=true", got, ok, billingreaders.Label)
		}
	}
}
