package controller

import (
	"maps"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"sigs.k8s.io/controller-runtime/pkg/event"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller/internal/testworld"
)

// Issue 36, route 6: a ResourceQuota counts a claim's devices under the
// class it names, so every class reaching a limited profile's devices gets
// a line; at the sum of what it reaches, so that nothing the webhook admits
// is refused; a line the admin wrote is taken as written.
func TestBackstopLinesCoverEveryClassReachingALimitedProfile(t *testing.T) {
	limits := map[string]int64{"h100": 2, "a100": 3, "named-catch-all": 8}
	reached := map[string][]string{
		"h100":            {"h100"},
		"a100":            {"a100"},
		"any-gpu":         {"a100", "h100", "l4"},
		"shared-mps":      {"h100", "shared-mps"}, // another profile's class over h100's devices
		"l4":              {"l4"},                 // no limit: no line
		"nic.example.com": nil,
		"named-catch-all": {"a100", "h100"},
		"h100-zero":       {"h100-zero"},
	}
	got := classLines(limits, reached)
	want := map[string]int64{"h100": 2, "a100": 3, "named-catch-all": 8, "any-gpu": 5, "shared-mps": 2}
	if !maps.Equal(got, want) {
		t.Errorf("lines %v, want %v", got, want)
	}
	if got := classLines(map[string]int64{"h100": 0}, reached); !maps.Equal(got, map[string]int64{"h100": 0, "any-gpu": 0, "shared-mps": 0, "named-catch-all": 0}) {
		t.Errorf("with h100: 0, lines %v: every class reaching an H100 must be held at 0", got)
	}
	if got := classLines(nil, reached); len(got) != 0 {
		t.Errorf("no limits, lines %v", got)
	}
}

// TestBackstopSkipsEventsThatMoveNoPrice (issue 52): the backstop
// invalidates the accountant's catalog on the events it passes, so it
// passes only those that can change what a class reaches: not a health
// taint on a device, nor a GpuProfile's status write.
func TestBackstopSkipsEventsThatMoveNoPrice(t *testing.T) {
	slice := testworld.ResourceSlice("node-a", testworld.WholeGPU(0))
	tainted := slice.DeepCopy()
	tainted.Spec.Devices[0].Taints = []resourceapi.DeviceTaint{{Key: "k", Effect: resourceapi.DeviceTaintEffectNoSchedule}}
	grown := slice.DeepCopy()
	grown.Spec.Devices = append(grown.Spec.Devices, testworld.WholeGPU(1))
	profile := testworld.GpuProfile("h100", gpuaas.ProfileSelector{Type: "gpu"})
	written := profile.DeepCopy()
	written.Status.ObservedGeneration = 1
	slices, profiles := reachChanged(&resourceapi.ResourceSlice{}), reachChanged(&gpuaas.GpuProfile{})
	if slices.Update(event.UpdateEvent{ObjectOld: slice, ObjectNew: tainted}) {
		t.Error("a health taint re-prices every claim")
	}
	if !slices.Update(event.UpdateEvent{ObjectOld: slice, ObjectNew: grown}) {
		t.Error("a new device does not reach the backstop")
	}
	if profiles.Update(event.UpdateEvent{ObjectOld: profile, ObjectNew: written}) {
		t.Error("a GpuProfile status write re-prices every claim")
	}
}
