package posture_test

import (
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpuaas/gpu-dra-driver/pkg/posture"
)

// A device is free only if the scheduler could give it now: the whole GPU
// of a dynamic-MIG GPU is not free while one of its partitions is taken
// (the profile's free count called it free), nor are partitions that
// overlap a taken one; a shared GPU's device is free while another share
// fits.
func TestGivable(t *testing.T) {
	slices := everyModeSlices(t)
	free := func(claims ...resourceapi.ResourceClaim) map[string]bool {
		return posture.Givable(node, slices, claims)
	}
	all := free()
	for name, ok := range all {
		if !ok {
			t.Errorf("%s not givable on an idle node", name)
		}
	}
	var part string // a 1g partition of dynamic-MIG GPU 0
	for name := range all {
		if len(name) > len("gpu-0-mig-1g") && name[:len("gpu-0-mig-1g")] == "gpu-0-mig-1g" {
			part = name
			break
		}
	}
	if part == "" {
		t.Fatal("no 1g partition on GPU 0")
	}
	got := free(claim("small", part))
	if got[part] || got["gpu-0"] {
		t.Errorf("with %s allocated: %s givable %v, gpu-0 givable %v; want neither", part, part, got[part], got["gpu-0"])
	}
	givable := 0
	for name, ok := range got {
		if ok && len(name) > 6 && name[:6] == "gpu-0-" {
			givable++
		}
	}
	if givable == 0 || givable >= gpu0Devices-2 {
		t.Errorf("%d of GPU 0's partitions givable with one 1g taken; want some, fewer than all the others", givable)
	}
	if !got["gpu-3"] {
		t.Error("an unrelated whole GPU is not givable")
	}
	if got := free(share("a", "40Gi")); !got["gpu-2-shared"] {
		t.Error("shared GPU with 40Gi of 80Gi left not givable")
	}
	if got := free(share("a", "40Gi"), share("b", "40Gi")); got["gpu-2-shared"] {
		t.Error("shared GPU with no memory left givable")
	}
}
