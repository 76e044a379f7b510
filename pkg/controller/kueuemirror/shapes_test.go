package kueuemirror

import (
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/kueue"
	"github.com/gpuaas/gpu-dra-driver/pkg/shape"
)

// TestKueueChargesAShapeAsItsGPUParts (issue 38 item 5): Kueue (v0.19.2,
// pkg/dra GetResourceRequestsForResourceClaimTemplates) marks a workload
// Inadmissible ("DeviceClass nic is not mapped in DRA configuration") when
// its claim template names a class the deviceClassMappings do not list, so
// the mappings must list every class of a shape's template: our profiles
// under the GPU-unit counter, another driver's NIC class by count under a
// resource of its own, so the shape costs in GPU units what its GPU part
// does alone.
func TestKueueChargesAShapeAsItsGPUParts(t *testing.T) {
	slot := &gpuaas.GpuShape{ObjectMeta: metav1.ObjectMeta{Name: "h100-slot"}, Spec: gpuaas.GpuShapeSpec{
		Requests:  []gpuaas.ShapeRequest{{Name: "gpu", Profile: "h100"}, {Name: "nic", DeviceClassName: "nic"}},
		Alignment: gpuaas.AlignPCIeRoot,
	}}
	mapped := renderedMappings(t, append(catalog(), slot)...)
	gpuPart := map[string]bool{"h100": true}
	spec := shape.ClaimSpec(slot)
	for _, r := range spec.Devices.Requests {
		m, ok := mapped[r.Exactly.DeviceClassName]
		switch {
		case !ok:
			t.Errorf("class %s of the shape's template is not mapped: Kueue refuses the workload", r.Exactly.DeviceClassName)
		case gpuPart[r.Exactly.DeviceClassName] && (m.Name != kueue.DefaultResource || len(m.Sources) != 1):
			t.Errorf("GPU part %s charged as %s with %d sources, want the GPU-unit counter", r.Exactly.DeviceClassName, m.Name, len(m.Sources))
		case !gpuPart[r.Exactly.DeviceClassName] && (m.Name != kueue.OtherDevicesResource || len(m.Sources) != 0):
			t.Errorf("another driver's class %s charged as %s with %d sources, want %s by count", r.Exactly.DeviceClassName, m.Name, len(m.Sources), kueue.OtherDevicesResource)
		}
	}
	// The same class in two shapes, or a profile's class named as a
	// class, is mapped once: Kueue refuses a class listed twice.
	twice := kueue.ShapeCharges([]gpuaas.GpuShape{*slot, *slot, {Spec: gpuaas.GpuShapeSpec{
		Requests: []gpuaas.ShapeRequest{{Name: "gpu", DeviceClassName: "h100"}}}}}, map[string]bool{"h100": true}, nil)
	if len(twice) != 1 || twice[0].DeviceClass != "nic" {
		t.Errorf("shape charges %+v, want nic once", twice)
	}
}

// TestKueueChargesOurClassNamedByAShapeInGPUUnits (issue 38 item 5): a
// shape may name a DeviceClass of ours that no profile renders (the demo
// catalog's gpu.gpuaas.io) by deviceClassName. Kueue must charge it in GPU
// units, as our admission prices it (kueueResourceOf), not by count as
// another driver's device: mapped as other devices, two whole GPUs of it
// cost a ClusterQueue no GPU units at all.
func TestKueueChargesOurClassNamedByAShapeInGPUUnits(t *testing.T) {
	pair := &gpuaas.GpuShape{ObjectMeta: metav1.ObjectMeta{Name: "pair"}, Spec: gpuaas.GpuShapeSpec{
		Requests: []gpuaas.ShapeRequest{
			{Name: "gpus", DeviceClassName: "gpu.gpuaas.io", Count: ptr.To[int64](2)},
			{Name: "labelled", DeviceClassName: "renamed"},
			{Name: "nic", DeviceClassName: "nic"},
			{Name: "later", DeviceClassName: "not-created-yet"},
		},
	}}
	renamed := deviceClass("renamed", `device.attributes["example.com"].x == "y"`)
	renamed.Labels = map[string]string{gpuaas.ProfileLabel: "h100"}
	mapped := renderedMappings(t, append(catalog(), pair, renamed,
		deviceClass("gpu.gpuaas.io", `device.driver == "gpu.gpuaas.io"`),
		deviceClass("nic", `device.driver == "nic.example.com"`))...)
	for class, want := range map[string]string{
		"gpu.gpuaas.io":   kueue.DefaultResource, // a selector naming our driver
		"renamed":         kueue.DefaultResource, // the label of the classes profiles render
		"nic":             kueue.OtherDevicesResource,
		"not-created-yet": kueue.OtherDevicesResource, // rendered again when it is created
	} {
		m, ok := mapped[class]
		switch {
		case !ok:
			t.Errorf("class %s is not mapped", class)
		case m.Name != want:
			t.Errorf("class %s charged as %s, want %s", class, m.Name, want)
		case want == kueue.DefaultResource && len(m.Sources) != 1:
			t.Errorf("class %s charged without the GPU-unit counter: %+v", class, m.Sources)
		}
	}
}

// renderedMappings reconciles the mappings over objs and returns the
// rendered deviceClassMappings by class.
func renderedMappings(t *testing.T, objs ...client.Object) map[string]kueue.DeviceClassMapping {
	t.Helper()
	c := newFakeClient(t, objs...)
	r := &kueueMappingsReconciler{profiles: c, direct: c, namespace: "gpuaas", shapes: true}
	var res struct {
		DeviceClassMappings []kueue.DeviceClassMapping `json:"deviceClassMappings"`
	}
	if err := yaml.Unmarshal([]byte(reconciledConfig(t, r)), &res); err != nil {
		t.Fatal(err)
	}
	mapped := map[string]kueue.DeviceClassMapping{}
	for _, m := range res.DeviceClassMappings {
		for _, c := range m.DeviceClassNames {
			mapped[c] = m
		}
	}
	return mapped
}

func deviceClass(name, cel string) *resourceapi.DeviceClass {
	return &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: resourceapi.DeviceClassSpec{
		Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: cel}}},
	}}
}
