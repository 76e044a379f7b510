package prepare

import (
	"fmt"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/device"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/prepare/preparetest"
	"k8s.io/apimachinery/pkg/types"
)

// setComputeMode puts a mock GPU in a mode, as an administrator, an MPS
// daemon whose reset failed, or another tool would leave it.
func (e *testEnv) setComputeMode(t *testing.T, uuid string, mode nvml.ComputeMode) {
	t.Helper()
	dev, err := e.Lib.DeviceByUUID(uuid)
	if err != nil {
		t.Fatal(err)
	}
	if ret := dev.SetComputeMode(mode); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
}

// TestTimeSlicingPutsGPUInDefaultComputeMode: a GPU left in
// EXCLUSIVE_PROCESS (or PROHIBITED) lets one process at a time (or none)
// create a context, so a time-sliced GPU's replicas after the first fail
// in their containers. Preparing the first replica puts the GPU in
// DEFAULT, with the Long interval (nvidia-smi) and with the Default one
// (no tool), and a later replica puts it back if something changed it
// meanwhile (issue 25 item 6).
func TestTimeSlicingPutsGPUInDefaultComputeMode(t *testing.T) {
	for _, interval := range []configapi.TimeSliceInterval{configapi.LongTimeSlice, ""} {
		t.Run(fmt.Sprintf("interval %q", interval), func(t *testing.T) {
			cfg := sharingNode()
			cfg.GPUs[0].TimeSlicing.Interval = interval
			e := newTestEnvWith(t, "dgxh100", cfg)
			withTools(t, e)
			uuid := e.GPUUUID(4)

			e.setComputeMode(t, uuid, nvml.COMPUTEMODE_EXCLUSIVE_PROCESS)
			if _, err := e.state.Prepare(e.Ctx, preparetest.NewClaim("a").Device("gpu", "gpu-4-ts-0").Build()); err != nil {
				t.Fatal(err)
			}
			if mode := e.computeMode(t, uuid); mode != nvml.COMPUTEMODE_DEFAULT {
				t.Errorf("compute mode %s after preparing a replica of a GPU left in EXCLUSIVE_PROCESS, want DEFAULT",
					device.ComputeModeName(mode, nvml.SUCCESS))
			}

			e.setComputeMode(t, uuid, nvml.COMPUTEMODE_PROHIBITED)
			if _, err := e.state.Prepare(e.Ctx, preparetest.NewClaim("b").Device("gpu", "gpu-4-ts-1").Build()); err != nil {
				t.Fatal(err)
			}
			if mode := e.computeMode(t, uuid); mode != nvml.COMPUTEMODE_DEFAULT {
				t.Errorf("compute mode %s after preparing a second replica, want DEFAULT", device.ComputeModeName(mode, nvml.SUCCESS))
			}
			for _, uid := range []string{"a", "b"} {
				if err := e.state.Unprepare(e.Ctx, types.UID(uid)); err != nil {
					t.Fatal(err)
				}
			}
			if mode := e.computeMode(t, uuid); mode != nvml.COMPUTEMODE_DEFAULT {
				t.Errorf("compute mode %s after the last replica, want DEFAULT", device.ComputeModeName(mode, nvml.SUCCESS))
			}
		})
	}
}

// TestTimeSlicingComputeModeFailureIsAClaimError: a GPU whose mode cannot
// be set (NVML refuses) fails the claim with a message that says why,
// rather than handing out replicas that cannot run.
func TestTimeSlicingComputeModeFailureIsAClaimError(t *testing.T) {
	e := newTestEnvWith(t, "dgxh100", sharingNode())
	withTools(t, e)
	uuid := e.GPUUUID(4)
	e.setComputeMode(t, uuid, nvml.COMPUTEMODE_EXCLUSIVE_PROCESS)
	for _, dev := range e.Lib.NVML().(*server.Server).Devices {
		if d := dev.(*server.Device); d.UUID == uuid {
			d.SetComputeModeFunc = func(nvml.ComputeMode) nvml.Return { return nvml.ERROR_NO_PERMISSION }
		}
	}
	_, err := e.state.Prepare(e.Ctx, preparetest.NewClaim("a").Device("gpu", "gpu-4-ts-0").Build())
	if err == nil || !strings.Contains(err.Error(), "DEFAULT compute mode (now EXCLUSIVE_PROCESS)") {
		t.Fatalf("prepare on a GPU stuck in EXCLUSIVE_PROCESS: %v, want an error naming the compute mode", err)
	}
	if e.CDISpecExists("a") || e.RecordExists("a") {
		t.Error("failed prepare left files")
	}
}
