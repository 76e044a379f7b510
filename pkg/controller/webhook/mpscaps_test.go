package webhook

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/gpuaas/gpu-dra-driver/pkg/controller/internal/testworld"
)

// The MPS limits of a class's config are what the admin sells: a claim
// whose config asks for more is refused when it is created, naming the
// cap, and one that asks for less is admitted.
func TestClaimMPSConfigAboveTheClassCapIsRefused(t *testing.T) {
	class := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "shared-mps"}, Spec: resourceapi.DeviceClassSpec{
		Config: []resourceapi.DeviceClassConfiguration{{DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
			Driver: driver, Parameters: runtime.RawExtension{Raw: []byte(`{"apiVersion":"gpu.gpuaas.io/v1alpha1","kind":"GpuConfig","sharing":{"strategy":"MPS","mpsConfig":{"defaultActiveThreadPercentage":5}}}`)},
		}}}},
	}}
	acct, c := newAccountant(t, append(world(t), class, ns("a", nil))...)
	h, _ := newClaimWebhook(t, acct)
	h.classes = c
	const mps = `{"apiVersion":"gpu.gpuaas.io/v1alpha1","kind":"GpuConfig","sharing":{"strategy":"MPS","mpsConfig":{"defaultActiveThreadPercentage":%s}}}`
	over := withConfig(claim("a", "greedy", "shared-mps", 1), strings.Replace(mps, "%s", "100", 1))
	resp := h.Handle(ctx(t), request(t, admissionv1.Create, "a", over.Name, over))
	if resp.Allowed || resp.Result.Code != http.StatusUnprocessableEntity ||
		!strings.Contains(resp.Result.Message, `mpsConfig.defaultActiveThreadPercentage 100 is above the cap of 5 (the config of DeviceClass "shared-mps")`) {
		t.Fatalf("over the cap: %+v", resp.Result)
	}
	under := withConfig(claim("a", "modest", "shared-mps", 1), strings.Replace(mps, "%s", "3", 1))
	if resp := h.Handle(ctx(t), request(t, admissionv1.Create, "a", under.Name, under)); resp.Result != nil && resp.Result.Code == http.StatusUnprocessableEntity {
		t.Fatalf("under the cap: %+v", resp.Result)
	}
}

// A template's claims are made later by the kube-controller-manager, where
// nobody sees a refusal: a template whose config asks for more than its
// class's cap is refused when it is created, naming the cap, as its claim
// would be.
func TestTemplateMPSConfigAboveTheClassCapIsRefused(t *testing.T) {
	class := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "shared-mps"}, Spec: resourceapi.DeviceClassSpec{
		Config: []resourceapi.DeviceClassConfiguration{{DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
			Driver: driver, Parameters: runtime.RawExtension{Raw: []byte(`{"apiVersion":"gpu.gpuaas.io/v1alpha1","kind":"GpuConfig","sharing":{"strategy":"MPS","mpsConfig":{"defaultActiveThreadPercentage":5,"defaultPinnedDeviceMemoryLimit":"2Gi"}}}`)},
		}}}},
	}}
	s, err := testworld.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	h := &templateWebhook{decoder: admission.NewDecoder(s), classes: newFakeClient(t, class)}
	template := func(name, mpsConfig string) *resourceapi.ResourceClaimTemplate {
		c := withConfig(claim("a", name, "shared-mps", 1),
			`{"apiVersion":"gpu.gpuaas.io/v1alpha1","kind":"GpuConfig","sharing":{"strategy":"MPS","mpsConfig":`+mpsConfig+`}}`)
		return &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: name},
			Spec: resourceapi.ResourceClaimTemplateSpec{Spec: c.Spec}}
	}
	for _, c := range []struct{ name, config, want string }{
		{"threads", `{"defaultActiveThreadPercentage":100}`, `mpsConfig.defaultActiveThreadPercentage 100 is above the cap of 5 (the config of DeviceClass "shared-mps")`},
		{"memory", `{"defaultPinnedDeviceMemoryLimit":"4Gi"}`, `mpsConfig.defaultPinnedDeviceMemoryLimit 4Gi is above the cap of 2Gi (the config of DeviceClass "shared-mps")`},
	} {
		tmpl := template(c.name, c.config)
		resp := h.Handle(ctx(t), request(t, admissionv1.Create, "a", tmpl.Name, tmpl))
		if resp.Allowed || resp.Result == nil || resp.Result.Code != http.StatusUnprocessableEntity ||
			!strings.Contains(resp.Result.Message, "spec.spec.devices.config[0]") || !strings.Contains(resp.Result.Message, c.want) {
			t.Errorf("template over the class's %s cap: allowed %v, %+v; want 422 naming %q", c.name, resp.Allowed, resp.Result, c.want)
		}
	}
	under := template("modest", `{"defaultActiveThreadPercentage":3,"defaultPinnedDeviceMemoryLimit":"1Gi"}`)
	if resp := h.Handle(ctx(t), request(t, admissionv1.Create, "a", under.Name, under)); !resp.Allowed {
		t.Fatalf("template under the caps refused: %+v", resp.Result)
	}
}

// A 1Gi share of an 80Gi GPU under MPS is 2% of its threads (the cap the
// plugin derives at prepare): a claim, or a template, whose config asks
// for all of them is refused when it is created, naming the share's cap,
// though no class caps it (issue 53, as reproduced on the real node). One
// within the share is admitted; a config for a whole GPU may ask 100%.
func TestMPSConfigAboveTheSharesCapIsRefused(t *testing.T) {
	share := resourceapi.Device{
		Name: "gpu-5-shared",
		Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			"type": testworld.Attr("shared"), "sharingStrategy": testworld.Attr("MPS"), "productName": testworld.Attr("NVIDIA H100 80GB HBM3"),
		},
		AllowMultipleAllocations: ptr.To(true),
		Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{"memory": {Value: resource.MustParse("80Gi"),
			RequestPolicy: &resourceapi.CapacityRequestPolicy{Default: qty("1Gi"), ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: qty("1Gi"), Step: qty("1Gi")}}}},
	}
	shared := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "shared.gpuaas.io"}, Spec: resourceapi.DeviceClassSpec{
		Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.driver == "gpu.gpuaas.io" && device.attributes["gpu.gpuaas.io"].type == "shared"`}}},
	}}
	whole := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "whole.gpuaas.io"}, Spec: resourceapi.DeviceClassSpec{
		Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.driver == "gpu.gpuaas.io" && device.attributes["gpu.gpuaas.io"].type == "gpu"`}}},
	}}
	acct, c := newAccountant(t, shared, whole, resourceSlice("node-a", wholeGPU(0), share), ns("a", nil))
	h, _ := newClaimWebhook(t, acct)
	h.classes, h.shares = c, acct
	s, err := testworld.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	th := &templateWebhook{decoder: admission.NewDecoder(s), classes: c, shares: acct}
	const mps = `{"apiVersion":"gpu.gpuaas.io/v1alpha1","kind":"GpuConfig","sharing":{"strategy":"MPS","mpsConfig":{"defaultActiveThreadPercentage":%d}}}`
	oneGi := func(name, class string, threads int) *resourceapi.ResourceClaim {
		cl := withConfig(claim("a", name, class, 1), fmt.Sprintf(mps, threads))
		if class == shared.Name {
			cl.Spec.Devices.Requests[0].Exactly.Capacity = &resourceapi.CapacityRequirements{
				Requests: map[resourceapi.QualifiedName]resource.Quantity{"memory": resource.MustParse("1Gi")}}
		}
		return cl
	}
	asTemplate := func(cl *resourceapi.ResourceClaim) *resourceapi.ResourceClaimTemplate {
		return &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: cl.Name},
			Spec: resourceapi.ResourceClaimTemplateSpec{Spec: cl.Spec}}
	}
	const want = `mpsConfig.defaultActiveThreadPercentage 100 is above the cap of 2 (the device's share of its GPU: the most request "gpu" can get is 1Gi of a GPU of 80Gi)`
	greedy := oneGi("greedy", shared.Name, 100)
	for what, resp := range map[string]admission.Response{
		"claim":    h.Handle(ctx(t), request(t, admissionv1.Create, "a", greedy.Name, greedy)),
		"template": th.Handle(ctx(t), request(t, admissionv1.Create, "a", greedy.Name, asTemplate(greedy))),
	} {
		if resp.Allowed || resp.Result == nil || resp.Result.Code != http.StatusUnprocessableEntity || !strings.Contains(resp.Result.Message, want) {
			t.Errorf("%s of a 1Gi MPS share asking 100%%: allowed %v, %+v; want 422 naming %q", what, resp.Allowed, resp.Result, want)
		}
	}
	for _, ok := range []*resourceapi.ResourceClaim{oneGi("modest", shared.Name, 2), oneGi("whole", whole.Name, 100)} {
		if resp := h.Handle(ctx(t), request(t, admissionv1.Create, "a", ok.Name, ok)); resp.Result != nil && resp.Result.Code == http.StatusUnprocessableEntity {
			t.Errorf("claim %s within its device's share refused: %+v", ok.Name, resp.Result)
		}
		if resp := th.Handle(ctx(t), request(t, admissionv1.Create, "a", ok.Name, asTemplate(ok))); !resp.Allowed {
			t.Errorf("template %s within its device's share refused: %+v", ok.Name, resp.Result)
		}
	}
}
