package plugin

import (
	"slices"
	"testing"

	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev/nvmock"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/prepare/preparetest"
)

// A switch that re-binds the GPU gives it a new minor number: the claim's
// CDI spec names the GPU's /dev/nvidiaN as NVML numbers it now, and the
// published devices carry the new minor.
func TestReboundGPUGetsItsNewDeviceNode(t *testing.T) {
	e := newModeEnv(t)
	d, pub := testDriver(t, e, preparetest.DynamicAll())
	e.state.OnRebound(d.gpuRebound)
	if err := nvmock.SetRebindOnMigMode(e.MockStateDir, "2", true); err != nil {
		t.Fatal(err)
	}
	if _, err := e.state.Prepare(e.Ctx, preparetest.NewClaim("m").Device("mig", e.Partition(t, 2, "2g.20gb")).Build()); err != nil {
		t.Fatal(err)
	}
	minor := e.minorNow(t, 2)
	if minor == 2 {
		t.Fatal("the mock did not re-bind the GPU")
	}
	if got := gpuNodes(t, e, "m"); !slices.Equal(got, []int{minor}) {
		t.Errorf("the CDI spec names /dev/nvidia%v, want /dev/nvidia%d (the GPU's minor since its MIG mode changed)", got, minor)
	}
	if pub.count() == 0 {
		t.Fatal("nothing republished after the re-bind")
	}
	for _, slice := range pub.last(t).Slices {
		for _, dev := range slice.Devices {
			if a, ok := dev.Attributes["uuid"]; ok && *a.StringValue == e.Lib.GPUs()[2].UUID {
				if got := dev.Attributes["minor"].IntValue; got == nil || *got != int64(minor) {
					t.Errorf("device %s published with minor %v, want %d", dev.Name, got, minor)
				}
			}
		}
	}

	// Back to a whole GPU: MIG mode off, re-bound again.
	if err := e.state.Unprepare(e.Ctx, "m"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.state.Prepare(e.Ctx, preparetest.NewClaim("w").Device("gpu", "gpu-2").Build()); err != nil {
		t.Fatal(err)
	}
	now := e.minorNow(t, 2)
	if now == minor {
		t.Fatal("the mock did not re-bind the GPU again")
	}
	if got := gpuNodes(t, e, "w"); !slices.Equal(got, []int{now}) {
		t.Errorf("the whole GPU's CDI spec names /dev/nvidia%v, want /dev/nvidia%d", got, now)
	}
}
