package e2e

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/gpuaas/gpu-dra-driver/pkg/controller"
	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

const quotaCRD = "tenantquotas.gpuaas.io"

// limitsProperties is the path of TenantQuota's spec.limits properties in
// its CRD (no validation rule of the spec names them).
var limitsProperties = []string{"schema", "openAPIV3Schema", "properties", "spec", "properties", "limits", "properties"}

// TestControllerUpgradesItsCRDs: helm installs crds/ once and never
// upgrades them, so a newer chart's fields were dropped (issue 12 item 11).
// The controller applies its own CRDs at start (--apply-crds, set by the
// chart): an older live CRD gets the missing field back, and a newer one
// (a field this binary does not know, as during a rollback) is left alone.
func TestControllerUpgradesItsCRDs(t *testing.T) {
	c := installCRDs(t)
	ctx := framework.Context(t, time.Minute)
	editQuotaSpecSchema(t, ctx, func(props map[string]any) { delete(props, "gpuMemory") })
	if err := controller.ApplyCRDs(ctx, c); err != nil {
		t.Fatal(err)
	}
	if _, ok := quotaSpecSchema(t, ctx)["gpuMemory"]; !ok {
		t.Fatal("the controller did not bring back spec.limits.gpuMemory of an older TenantQuota CRD")
	}

	editQuotaSpecSchema(t, ctx, func(props map[string]any) { props["futureField"] = map[string]any{"type": "string"} })
	t.Cleanup(func() {
		editQuotaSpecSchema(t, context.WithoutCancel(ctx), func(props map[string]any) { delete(props, "futureField") })
	})
	if err := controller.ApplyCRDs(ctx, c); err != nil {
		t.Fatal(err)
	}
	if _, ok := quotaSpecSchema(t, ctx)["futureField"]; !ok {
		t.Fatal("the controller downgraded a newer TenantQuota CRD, dropping its field")
	}
}

func quotaSpecSchema(t *testing.T, ctx context.Context) map[string]any {
	t.Helper()
	u, err := cp.Dynamic.Resource(crdGVR).Get(ctx, quotaCRD, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	versions, _, _ := unstructured.NestedSlice(u.Object, "spec", "versions")
	props, _, _ := unstructured.NestedMap(versions[0].(map[string]any), limitsProperties...)
	return props
}

// editQuotaSpecSchema changes the live CRD's spec properties, as another
// version of the chart would have installed them.
func editQuotaSpecSchema(t *testing.T, ctx context.Context, edit func(map[string]any)) {
	t.Helper()
	crds := cp.Dynamic.Resource(crdGVR)
	// The kube-apiserver's CRD controllers write its status meanwhile.
	onConflictRetry(t, "editing CRD "+quotaCRD, func() error {
		u, err := crds.Get(ctx, quotaCRD, metav1.GetOptions{})
		if err != nil {
			return err
		}
		versions, _, _ := unstructured.NestedSlice(u.Object, "spec", "versions")
		v0 := versions[0].(map[string]any)
		props, _, _ := unstructured.NestedMap(v0, limitsProperties...)
		edit(props)
		if err := unstructured.SetNestedMap(v0, props, limitsProperties...); err != nil {
			return err
		}
		versions[0] = v0
		if err := unstructured.SetNestedSlice(u.Object, versions, "spec", "versions"); err != nil {
			return err
		}
		_, err = crds.Update(ctx, u, metav1.UpdateOptions{})
		return err
	})
}
