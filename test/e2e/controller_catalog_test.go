package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

// TestControllerCatalog: a GpuProfile becomes a DeviceClass owned by it; a
// hand edit of the class is reverted; a disabled profile keeps its class
// while a claim names it and loses it once the claim is gone.
func TestControllerCatalog(t *testing.T) {
	rc := startController(t)
	ctx := framework.Context(t, 3*time.Minute)
	name := uniqueName("catalog")
	p := profile(name, gpuaas.ProfileSelector{Type: gpuaas.DeviceTypeGPU, Architecture: "Hopper"})
	p.Spec.DisplayName = "Whole Hopper GPU"
	createObject(t, p)
	p = waitForProfileReady(t, name)
	if p.Status.DeviceClassName != name {
		t.Fatalf("status.deviceClassName = %q", p.Status.DeviceClassName)
	}
	dc := getDeviceClass(t, ctx, name)
	if ref := metav1.GetControllerOf(dc); ref == nil || ref.UID != p.UID || len(dc.Spec.Selectors) != 3 {
		t.Fatalf("class: owner %v, selectors %+v", ref, dc.Spec.Selectors)
	}

	onConflictRetry(t, "widening DeviceClass "+name+" by hand", func() error {
		dc := getDeviceClass(t, ctx, name)
		dc.Spec.Selectors = dc.Spec.Selectors[:1]
		_, err := cp.Client.ResourceV1().DeviceClasses().Update(ctx, dc, metav1.UpdateOptions{})
		return err
	})
	waitForDeviceClass(t, ctx, name, "reverted", func(dc *resourceapi.DeviceClass) bool { return dc != nil && len(dc.Spec.Selectors) == 3 })

	ns := cp.CreateNamespace(t, "catalog")
	if err := createClaim(ctx, gpuClaim(ns, "user", name, 1)); err != nil {
		t.Fatal(err)
	}
	setEnabled(t, ctx, name, false)
	waitForProfile(t, name, "draining", func(p *gpuaas.GpuProfile) bool {
		c := findCondition(p.Status.Conditions, gpuaas.ConditionReady)
		return c != nil && c.Reason == gpuaas.ReasonDraining && strings.Contains(c.Message, ns+"/user")
	})
	if getDeviceClass(t, ctx, name) == nil {
		t.Fatal("class of a disabled profile removed while a claim uses it")
	}
	if err := cp.Client.ResourceV1().ResourceClaims(ns).Delete(ctx, "user", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitForDeviceClass(t, ctx, name, "removed", func(dc *resourceapi.DeviceClass) bool { return dc == nil })
	setEnabled(t, ctx, name, true)
	waitForDeviceClass(t, ctx, name, "back", func(dc *resourceapi.DeviceClass) bool { return dc != nil })
	rc.alive(t)
}

func setEnabled(t *testing.T, ctx context.Context, name string, enabled bool) {
	t.Helper()
	p := &gpuaas.GpuProfile{ObjectMeta: metav1.ObjectMeta{Name: name}}
	updateObject(t, ctx, p, func(p *gpuaas.GpuProfile) { p.Spec.Enabled = ptr.To(enabled) })
}

func getDeviceClass(t *testing.T, ctx context.Context, name string) *resourceapi.DeviceClass {
	t.Helper()
	dc, err := cp.Client.ResourceV1().DeviceClasses().Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return dc
}

func waitForDeviceClass(t *testing.T, ctx context.Context, name, what string, cond func(*resourceapi.DeviceClass) bool) {
	t.Helper()
	err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		return cond(getDeviceClass(t, ctx, name)), nil
	})
	if err != nil {
		t.Fatalf("DeviceClass %s not %s: %v", name, what, err)
	}
}

// TestControllerBadInput: bad catalog entries and quotas are refused with a
// clear message when created, or, when they got in while the controller was
// down, flagged in status; two quotas claiming one namespace are flagged
// and the older one charges; none of it stops the controller.
func TestControllerBadInput(t *testing.T) {
	c := installCRDs(t)
	ctx := framework.Context(t, 3*time.Minute)
	ns := cp.CreateNamespace(t, "bad-input")

	// CRD validation, with or without the controller.
	for _, tc := range []struct{ limits, want string }{
		{`{"gpuUnits": "-1"}`, "gpuUnits must not be negative"},
		{`{"gpuMemory": "-80Gi"}`, "gpuMemory must not be negative"},
		{`{"gpuUnits": "lots"}`, "spec.limits.gpuUnits in body should match"},
		{`{"devices": {"h100": -1}}`, "device limits must not be negative"},
	} {
		obj := unstructuredQuota(t, uniqueName("bad"), ns, tc.limits)
		_, err := cp.ApplyObject(ctx, obj, "")
		mustDeny(t, err, tc.want)
	}

	// Profiles the webhook would refuse, stored while no controller runs.
	badCEL, badMIG := uniqueName("bad-cel"), uniqueName("bad-mig")
	createObject(t, profile(badCEL, gpuaas.ProfileSelector{CEL: `device.attributes["gpu.gpuaas.io"].type ==`}))
	createObject(t, profile(badMIG, gpuaas.ProfileSelector{MigProfile: "1g.11gb"}))
	older, newer := uniqueName("older"), uniqueName("newer")
	createObject(t, quotaFor(older, []string{ns}, gpuaas.QuotaLimits{GpuUnits: units("1")}))
	time.Sleep(1100 * time.Millisecond) // creation timestamps have second resolution
	createObject(t, quotaFor(newer, []string{ns}, gpuaas.QuotaLimits{GpuUnits: units("8")}))

	rc := startController(t)
	for name, want := range map[string]string{badCEL: "spec.selector.cel", badMIG: `spec.selector.migProfile: Invalid value: "1g.11gb"`} {
		p := waitForProfile(t, name, "flagged invalid", func(p *gpuaas.GpuProfile) bool {
			c := findCondition(p.Status.Conditions, gpuaas.ConditionReady)
			return c != nil && c.Reason == gpuaas.ReasonInvalidSpec
		})
		if c := findCondition(p.Status.Conditions, gpuaas.ConditionReady); !strings.Contains(c.Message, want) {
			t.Errorf("profile %s: message %q lacks %q", name, c.Message, want)
		}
		if getDeviceClass(t, ctx, name) != nil {
			t.Errorf("invalid profile %s got a DeviceClass", name)
		}
	}
	q := waitForQuota(t, newer, "flagged", func(q *gpuaas.TenantQuota) bool {
		c := findCondition(q.Status.Conditions, gpuaas.ConditionNamespaceConflict)
		return c != nil && c.Status == metav1.ConditionTrue
	})
	if c := findCondition(q.Status.Conditions, gpuaas.ConditionNamespaceConflict); !strings.Contains(c.Message, `charged to the older TenantQuota "`+older+`"`) {
		t.Errorf("conflict message %q", c.Message)
	}
	class := uniqueName("gpu")
	createObject(t, profile(class, gpuaas.ProfileSelector{Type: gpuaas.DeviceTypeGPU}))
	waitForProfileReady(t, class)
	mustDeny(t, createClaim(ctx, gpuClaim(ns, "two", class, 2)), `TenantQuota "`+older+`" exceeded`, "limit 1")

	// With the controller up, bad input fails at apply.
	err := c.Create(ctx, profile(uniqueName("bad-cel"), gpuaas.ProfileSelector{CEL: "device.nope > 1"}))
	mustDeny(t, err, "spec.selector.cel", "compilation failed", "undefined field 'nope'")
	badCfg := profile(uniqueName("bad-cfg"), gpuaas.ProfileSelector{Type: gpuaas.DeviceTypeGPU})
	badCfg.Spec.Config = &runtime.RawExtension{Raw: []byte(`{"apiVersion":"gpu.gpuaas.io/v1alpha1","kind":"GpuConfig","sharring":{}}`)}
	err = c.Create(ctx, badCfg)
	mustDeny(t, err, "spec.config", `unknown field "sharring"`)
	bad := gpuClaim(ns, "bad-config", class, 1)
	bad.Spec.Devices.Config = opaqueConfig(t, map[string]any{"apiVersion": "gpu.gpuaas.io/v1alpha1", "kind": "GpuConfig", "sharring": map[string]any{}})
	mustDeny(t, createClaim(ctx, bad), "spec.devices.config[0].opaque.parameters", `unknown field "sharring"`)
	rc.alive(t)
}

func unstructuredQuota(t *testing.T, name, namespace, limits string) *unstructured.Unstructured {
	t.Helper()
	obj := &unstructured.Unstructured{}
	err := obj.UnmarshalJSON([]byte(`{"apiVersion":"gpuaas.io/v1alpha1","kind":"TenantQuota","metadata":{"name":"` + name +
		`"},"spec":{"namespaces":["` + namespace + `"],"limits":` + limits + `}}`))
	if err != nil {
		t.Fatal(err)
	}
	return obj
}
