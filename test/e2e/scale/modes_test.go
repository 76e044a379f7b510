package scale

import (
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
)

var createOpts = metav1.CreateOptions{}

// mixedProfiles are the MIG profiles the mixed mode's pods ask for in turn;
// each has a DeviceClass of its own, as a catalog entry renders.
var mixedProfiles = []string{"1g.10gb", "2g.20gb", "3g.40gb"}

func migClassName(profile string) string { return "mig-" + profile + ".gpuaas.io" }

func migClass(profile string) *resourceapi.DeviceClass {
	name := migClassName(profile)
	if profile == "1g.10gb" {
		name = "scale-" + name // the catalog has mig-1g.10gb.gpuaas.io already
	}
	return &resourceapi.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
			Expression: fmt.Sprintf(`device.driver == %q && device.attributes[%q].type == "mig" && device.attributes[%q].profile == %q`,
				configapi.DriverName, configapi.DriverName, configapi.DriverName, profile),
		}}}},
	}
}

// mode is one way the scheduler is asked for devices: how every node
// offers its GPUs, and the claims of the measured pods (pod i gets
// claims[i % len]); no claims is the baseline of plain pods.
type mode struct {
	name   string
	config string
	claims []resourceapi.DeviceRequest
	// spec, when set, is the one claim every measured pod gets (a
	// multi-request claim, such as a shape's), instead of claims.
	spec *resourceapi.ResourceClaimSpec
	// prefillGPUs, when set, is how many whole GPUs of every node are
	// taken before the measurement (prefillWholeGPUs), to leave the nodes
	// part full.
	prefillGPUs int
	// fewerPods measures a fifth of the pods: the mode is slow enough
	// (every full GPU's devices are checked before a free one) that the
	// full count would take most of the run.
	fewerPods bool
}

// templates are the claims of the measured pods, one template each:
// spec, or one per request of claims.
func (m mode) templates() []resourceapi.ResourceClaimSpec {
	if m.spec != nil {
		return []resourceapi.ResourceClaimSpec{*m.spec}
	}
	out := make([]resourceapi.ResourceClaimSpec, 0, len(m.claims))
	for _, req := range m.claims {
		out = append(out, resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{req}}})
	}
	return out
}

func (m mode) podsDivisor() int {
	if m.fewerPods {
		return 5
	}
	return 1
}

func exactly(class string) resourceapi.DeviceRequest {
	return resourceapi.DeviceRequest{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: class}}
}

// Node configurations, as an admin writes them (decoded, defaulted and
// validated as the plugin does its --node-config).
const (
	wholeConfig   = ""
	dynamicConfig = "default: {mig: dynamic}"
	// fourProfiles offers the MIG profiles a catalog of small, medium and
	// large slices and whole GPUs sells: 14 devices per GPU instead of 26.
	fourProfilesConfig = "default: {mig: dynamic, migProfiles: [1g.10gb, 2g.20gb, 3g.40gb, 7g.80gb]}"
	timeSliceConfig    = "default: {timeSlicing: {replicas: 4}}"
	sharedConfig       = "default: {shared: {memory: {min: 1Gi, step: 1Gi, default: 1Gi}}}"
)

// modes are the cases of issue 14, baseline and whole GPU first: the
// others are reported as ratios to those two.
func modes() []mode {
	share := exactly("shared.gpuaas.io")
	share.Exactly.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
		"memory": resource.MustParse("10Gi"),
	}}
	var mixed []resourceapi.DeviceRequest
	for _, p := range mixedProfiles {
		mixed = append(mixed, exactly(migClass(p).Name))
	}
	return []mode{
		{name: "no-claim", config: wholeConfig},
		{name: "whole-gpu", config: wholeConfig, claims: []resourceapi.DeviceRequest{exactly("gpu.gpuaas.io")}},
		{name: "first-available", config: wholeConfig, claims: []resourceapi.DeviceRequest{{Name: "gpu", FirstAvailable: []resourceapi.DeviceSubRequest{
			{Name: "mig", DeviceClassName: "mig-1g.10gb.gpuaas.io"},
			{Name: "whole", DeviceClassName: "gpu.gpuaas.io"},
		}}}},
		{name: "dynamic-mig-1g", config: dynamicConfig, claims: []resourceapi.DeviceRequest{exactly("mig-1g.10gb.gpuaas.io")}},
		{name: "dynamic-mig-1g-four-profiles", config: fourProfilesConfig, claims: []resourceapi.DeviceRequest{exactly("mig-1g.10gb.gpuaas.io")}},
		{name: "dynamic-mig-mixed-half-full", config: dynamicConfig, claims: mixed, prefillGPUs: 4, fewerPods: true},
		{name: "time-slice-replica", config: timeSliceConfig,
			claims: []resourceapi.DeviceRequest{exactly("timeslice.gpuaas.io")}},
		{name: "memory-share", config: sharedConfig,
			claims: []resourceapi.DeviceRequest{share}},
	}
}
