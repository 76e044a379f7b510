package prepare

import (
	"testing"

	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/device"

	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/prepare/preparetest"
	resourceapi "k8s.io/api/resource/v1"
)

func TestConfigPriority(t *testing.T) {
	// Only the strategy "Exclusive" exists today, so priority is observed
	// through which entry is chosen: the claim's config, written after the
	// class's, must win; a config for another request must not apply.
	const gpuCfg = `{"apiVersion":"gpu.gpuaas.io/v1alpha1","kind":"GpuConfig","sharing":{"strategy":"Exclusive"}}`
	const bare = `{"apiVersion":"gpu.gpuaas.io/v1alpha1","kind":"GpuConfig"}`
	claim := preparetest.NewClaim("x").
		Config(resourceapi.AllocationConfigSourceClaim, bare).
		Config(resourceapi.AllocationConfigSourceClass, gpuCfg).
		Config(resourceapi.AllocationConfigSourceClaim, gpuCfg, "other").
		Build()
	configs, err := decodeConfigs(claim.Status.Allocation.Devices.Config)
	if err != nil {
		t.Fatal(err)
	}
	if len(configs) != 3 || configs[0].config.(*configapi.GpuConfig).Sharing == nil {
		t.Fatalf("class config not first: %+v", configs)
	}
	got, err := configFor(configs, "gpu", device.TypeGPU)
	if err != nil {
		t.Fatal(err)
	}
	if got.(*configapi.GpuConfig).Sharing != nil {
		t.Errorf("chose %+v, want the claim's bare config", got)
	}
	got, _ = configFor(configs, "other/sub", device.TypeGPU)
	if got.(*configapi.GpuConfig).Sharing == nil {
		t.Errorf("subrequest of 'other' did not get its config")
	}
}

func TestConfigIgnoresOtherDrivers(t *testing.T) {
	configs, err := decodeConfigs([]resourceapi.DeviceAllocationConfiguration{{
		Source: resourceapi.AllocationConfigSourceClaim,
		DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
			Driver: "nic.example.com",
		}},
	}})
	if err != nil || len(configs) != 0 {
		t.Fatalf("configs %v err %v", configs, err)
	}
	got, err := configFor(configs, "gpu", device.TypeGPU)
	if err != nil || got.SharingStrategy() != configapi.ExclusiveStrategy {
		t.Errorf("default = %v, %v", got, err)
	}
}
