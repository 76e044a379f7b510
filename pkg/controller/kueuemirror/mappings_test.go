package kueuemirror

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
)

// Issue 15: the catalog drives Kueue. Every enabled profile's class is
// listed under the Kueue resource it is charged as; a disabled one is not.
func TestKueueMappingsFollowTheCatalog(t *testing.T) {
	a100 := gpuProfile("a100", gpuaas.ProfileSelector{Type: "gpu"})
	a100.Spec.KueueResource = ptr.To("gpu.gpuaas.io/a100-milliunits")
	off := gpuProfile("retired", gpuaas.ProfileSelector{Type: "gpu"})
	off.Spec.Enabled = ptr.To(false)
	shared := gpuProfile("shared-4way", gpuaas.ProfileSelector{Type: "shared"})
	c := newFakeClient(t, append(catalog(), a100, off, shared)...)
	r := &kueueMappingsReconciler{profiles: c, direct: c, namespace: "gpuaas"}
	got := reconciledConfig(t, r)
	for _, want := range []string{
		"- deviceClassNames:\n  - a100\n  name: gpu.gpuaas.io/a100-milliunits",
		"- deviceClassNames:\n  - h100\n  - mig-1g\n  name: gpu.gpuaas.io/gpu-milliunits",
		"name: gpu-milliunits",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("mappings lack %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "retired") || strings.Contains(got, "shared-4way") {
		t.Errorf("a disabled or shared profile is mapped:\n%s", got)
	}
}

// reconciledConfig reconciles once and returns what r wrote into the
// ConfigMap.
func reconciledConfig(t *testing.T, r *kueueMappingsReconciler) string {
	t.Helper()
	if _, err := r.Reconcile(ctx(t), kueueMappingsKey); err != nil {
		t.Fatal(err)
	}
	var cm corev1.ConfigMap
	if err := r.direct.Get(ctx(t), types.NamespacedName{Namespace: r.namespace, Name: MappingsConfigMap}, &cm); err != nil {
		t.Fatal(err)
	}
	return cm.Data[MappingsKey]
}

// pricesBySelector prices a class by the type its selectors name.
type pricesBySelector map[string]int64

func (p pricesBySelector) MaxMilliunits(_ context.Context, selectors []string) (int64, bool, error) {
	for typ, milli := range p {
		if strings.Contains(strings.Join(selectors, " && "), `"`+typ+`"`) {
			return milli, true, nil
		}
	}
	return 0, false, nil
}

// Issue 54: a pod asking a profile's extended resource under a LocalQueue
// stayed Pending ("resource gpuaas.io/shared-gpu unavailable in
// ClusterQueue"), or was charged gpuaas.io/shared-gpu outside the GPU
// units. The mappings now carry a transformation per extended resource:
// charged the milli-units of the profile's device, in the profile's Kueue
// resource, instead of the extended resource; one not priced yet is named.
func TestKueueMappingsChargeExtendedResourcesInGPUUnits(t *testing.T) {
	replicas := gpuProfile("shared-4way", gpuaas.ProfileSelector{Type: "timeslice"})
	replicas.Spec.ExtendedResourceName = ptr.To("gpuaas.io/shared-gpu")
	whole := gpuProfile("a100", gpuaas.ProfileSelector{Type: "gpu", ProductName: "A100"})
	whole.Spec.ExtendedResourceName = ptr.To("nvidia.com/gpu")
	whole.Spec.KueueResource = ptr.To("gpu.gpuaas.io/a100-milliunits")
	mig := gpuProfile("mig-2g", gpuaas.ProfileSelector{Type: "mig", MigProfile: "2g.20gb"})
	mig.Spec.ExtendedResourceName = ptr.To("gpuaas.io/mig-2g")
	c := newFakeClient(t, replicas, whole, mig)
	r := &kueueMappingsReconciler{profiles: c, direct: c, namespace: "gpuaas",
		prices: pricesBySelector{"timeslice": 250, "gpu": 1000}}
	got := reconciledConfig(t, r)
	for _, want := range []string{
		"transformations:\n- input: gpuaas.io/shared-gpu\n  outputs:\n    gpu.gpuaas.io/gpu-milliunits: \"250\"\n  strategy: Replace",
		"- input: nvidia.com/gpu\n  outputs:\n    gpu.gpuaas.io/a100-milliunits: \"1000\"\n  strategy: Replace",
		"--feature-gates=KueueDRAIntegrationExtendedResource=false",
		"Not priced yet, no device published: mig-2g (gpuaas.io/mig-2g)",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("rendered configuration lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "- input: gpuaas.io/mig-2g") {
		t.Errorf("an extended resource with no published device is transformed (at what price?):\n%s", got)
	}
}
