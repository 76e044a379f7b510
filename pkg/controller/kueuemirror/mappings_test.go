package kueuemirror

import (
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
	if _, err := r.Reconcile(ctx(t), kueueMappingsKey); err != nil {
		t.Fatal(err)
	}
	var cm corev1.ConfigMap
	if err := c.Get(ctx(t), types.NamespacedName{Namespace: "gpuaas", Name: MappingsConfigMap}, &cm); err != nil {
		t.Fatal(err)
	}
	got := cm.Data[MappingsKey]
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
