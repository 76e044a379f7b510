package prepare

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/gpuaas/gpu-dra-driver/pkg/mig"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev/nvmock"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/prepare/preparetest"
)

// Issue 25 item 2: MIG mode switches are not final on real hardware. These
// run on the persistent mock machine with its MIG mode faults on
// (pkg/nvdev/nvmock/mockmigmode.go, mocknvml hold, mig-mode-in-use,
// mig-mode-pending, rebind-on-mig-mode).

// newModeEnv is a dynamic-MIG node on a persistent mock machine whose
// MIG mode changes wait briefly for a held GPU.
func newModeEnv(t *testing.T) *testEnv {
	t.Helper()
	e := newTestEnvIn(t, "dgxh100", preparetest.DynamicAll(), t.TempDir())
	e.state.env.InUseRetry = preparetest.FastInUseRetry
	return e
}

// checkNothingLeft checks that a failed prepare on a GPU left nothing: no
// record, no CDI spec, no MIG device, MIG mode off with nothing pending.
func (e *testEnv) checkNothingLeft(t *testing.T, uid string, index int) {
	t.Helper()
	if e.RecordExists(uid) || e.CDISpecExists(uid) {
		t.Errorf("claim %s left a record (%v) or a CDI spec (%v)", uid, e.RecordExists(uid), e.CDISpecExists(uid))
	}
	if left := e.MIGDevices(t, index); len(left) != 0 {
		t.Errorf("MIG devices left on GPU %d: %+v", index, left)
	}
	if cur, pend, ret := e.GPUDev(t, index).GetMigMode(); ret != nvml.SUCCESS || cur != nvml.DEVICE_MIG_DISABLE || pend != cur {
		t.Errorf("GPU %d MIG mode %d pending %d (%v), want off with nothing pending", index, cur, pend, ret)
	}
}

// A GPU another process holds for a moment (the next changes answer
// ERROR_IN_USE) gets its MIG device once it is free, within the prepare.
func TestPrepareWaitsForAGPUHeldForAMoment(t *testing.T) {
	e := newModeEnv(t)
	e.state.env.InUseRetry.Within = time.Minute // however slow the machine
	if err := nvmock.SetMigModeInUse(e.MockStateDir, "2", 3); err != nil {
		t.Fatal(err)
	}
	if _, err := e.state.Prepare(e.Ctx, preparetest.NewClaim("m").Device("mig", e.Partition(t, 2, "2g.20gb")).Build()); err != nil {
		t.Fatalf("prepare on a GPU held for three refusals: %v", err)
	}
	if made := e.MIGDevices(t, 2); len(made) != 1 {
		t.Fatalf("MIG devices on GPU 2: %+v, want the claim's", made)
	}
}

// A GPU held for longer than the wait: the claim fails naming the GPU and
// the process NVML lists on it, and nothing is left behind; once the
// holder is gone the kubelet's retry prepares it.
func TestPrepareOnAHeldGPUFailsNamingTheHolder(t *testing.T) {
	e := newModeEnv(t)
	holder := nvmock.Process{PID: 4242, Name: "dcgm-exporter"}
	if err := nvmock.SetHolder(e.MockStateDir, "2", holder, true); err != nil {
		t.Fatal(err)
	}
	claim := preparetest.NewClaim("m").Device("mig", e.Partition(t, 2, "2g.20gb")).Build()
	_, err := e.state.Prepare(e.Ctx, claim)
	if !errors.Is(err, nvml.ERROR_IN_USE) {
		t.Fatalf("prepare on a held GPU = %v, want ERROR_IN_USE", err)
	}
	for _, want := range []string{e.Lib.GPUs()[2].UUID, "(GPU 2)", "another process holds the GPU", "pid 4242 (dcgm-exporter)"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	e.checkNothingLeft(t, "m", 2)

	if err := nvmock.SetHolder(e.MockStateDir, "2", holder, false); err != nil {
		t.Fatal(err)
	}
	if _, err := e.state.Prepare(e.Ctx, claim); err != nil {
		t.Fatalf("the kubelet's retry once the GPU is free: %v", err)
	}
}

// A whole GPU in dynamic mode needs MIG mode off: a held GPU refuses that
// too, and the claim says so.
func TestWholeGPUOnAHeldGPUFailsClearly(t *testing.T) {
	e := newModeEnv(t)
	if _, ret := e.GPUDev(t, 5).SetMigMode(nvml.DEVICE_MIG_ENABLE); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if err := nvmock.SetMigModeInUse(e.MockStateDir, "5", 1000); err != nil {
		t.Fatal(err)
	}
	_, err := e.state.Prepare(e.Ctx, preparetest.NewClaim("w").Device("gpu", "gpu-5").Build())
	if !errors.Is(err, nvml.ERROR_IN_USE) || !strings.Contains(err.Error(), "NVML lists no process on it") {
		t.Fatalf("whole GPU on a held GPU = %v, want ERROR_IN_USE saying what may hold it", err)
	}
	if e.RecordExists("w") || e.CDISpecExists("w") {
		t.Error("the failed prepare left a record or a CDI spec")
	}
}

// A switch the driver leaves pending a reset is put back, the claim fails
// saying so, and no mode waits for the GPU's next reset.
func TestPendingMigModeIsPutBack(t *testing.T) {
	e := newModeEnv(t)
	if err := nvmock.SetMigModePending(e.MockStateDir, "2", true); err != nil {
		t.Fatal(err)
	}
	_, err := e.state.Prepare(e.Ctx, preparetest.NewClaim("m").Device("mig", e.Partition(t, 2, "2g.20gb")).Build())
	if !errors.Is(err, mig.ErrPendingReset) || !strings.Contains(err.Error(), "pending a GPU reset") {
		t.Fatalf("prepare with the switch left pending = %v, want ErrPendingReset", err)
	}
	e.checkNothingLeft(t, "m", 2)
	if err := nvmock.ResetGPU(e.MockStateDir, "2"); err != nil {
		t.Fatal(err)
	}
	if cur, _, _ := e.GPUDev(t, 2).GetMigMode(); cur != nvml.DEVICE_MIG_DISABLE {
		t.Error("the GPU's reset switched MIG on: the change was left pending")
	}
}
