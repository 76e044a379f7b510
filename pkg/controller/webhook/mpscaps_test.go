package webhook

import (
	"net/http"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
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
