package prepare

import (
	"math"
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/checkpoint"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/prepare/preparetest"
)

// The record keeps what the use sampler needs after a restart: the pods
// the claim is reserved for, each device's DeviceClass (its profile) and
// the part of its GPU the claim holds.
func TestRecordKeepsWhatUseSamplingNeeds(t *testing.T) {
	cfg := sharingNode()
	cfg.GPUs[0].TimeSlicing.Interval = "" // no nvidia-smi needed
	e := newTestEnvWith(t, "dgxh100", cfg)
	withClass := func(b *preparetest.ClaimBuilder, class string) *resourceapi.ResourceClaim {
		c := b.Build()
		c.Spec.Devices.Requests = []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: class}}}
		return c
	}
	shareCapacity := e.state.DeviceMap()["gpu-5-shared"].API.Capacity["memory"].Value
	for _, c := range []struct {
		claim *resourceapi.ResourceClaim
		class string
		share float64
	}{
		{withClass(preparetest.NewClaim("whole").Device("gpu", "gpu-0"), "gpu.gpuaas.io"), "gpu.gpuaas.io", 1},
		{withClass(preparetest.NewClaim("replica").Device("gpu", "gpu-4-ts-1"), "timeslice"), "timeslice", 0.25},
		{withClass(shareClaim("share", "10Gi"), "shared"), "shared", float64(10<<30) / float64(shareCapacity.Value())},
	} {
		if _, err := e.state.Prepare(e.Ctx, c.claim); err != nil {
			t.Fatalf("%s: %v", c.claim.Name, err)
		}
		rec, err := e.state.env.Store.Load(string(c.claim.UID))
		if err != nil || rec == nil {
			t.Fatalf("record of %s: %v, %v", c.claim.Name, rec, err)
		}
		wantPod := checkpoint.Pod{UID: "pod-" + string(c.claim.UID), Name: "p"}
		if len(rec.Pods) != 1 || rec.Pods[0] != wantPod {
			t.Errorf("%s: pods %v, want [%v]", c.claim.Name, rec.Pods, wantPod)
		}
		d := rec.Devices[0]
		if d.DeviceClass != c.class || math.Abs(d.GPUShare-c.share) > 1e-9 {
			t.Errorf("%s: device class %q, share %v; want %q, %v", c.claim.Name, d.DeviceClass, d.GPUShare, c.class, c.share)
		}
	}
}

func TestRequestDeviceClassOfSubrequest(t *testing.T) {
	claim := &resourceapi.ResourceClaim{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{
		{Name: "gpu", FirstAvailable: []resourceapi.DeviceSubRequest{{Name: "big", DeviceClassName: "h100"}, {Name: "small", DeviceClassName: "mig-1g"}}},
	}}}}
	if got := RequestDeviceClass(claim, "gpu/small"); got != "mig-1g" {
		t.Errorf("RequestDeviceClass(gpu/small) = %q, want mig-1g", got)
	}
	if got := RequestDeviceClass(claim, "other"); got != "" {
		t.Errorf("RequestDeviceClass(other) = %q, want none", got)
	}
}
