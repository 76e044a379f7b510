package plugin

import (
	"errors"
	"sync/atomic"
	"testing"

	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev/nvmock"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/maintenance"
)

// followedUpgradeState makes the plugin follow a stand-in for its node's
// GPU Operator upgrade-state label, set by the test.
func followedUpgradeState(m *maintEnv, initial string) *atomic.Value {
	var state atomic.Value
	state.Store(initial)
	m.upgradeState = func() string { return state.Load().(string) }
	return &state
}

// Issue 25 item 4 (what was left): the GPU Operator's driver upgrade
// stalled on a node where the plugin ran, since its NVML session kept the
// next driver pod from unloading the kernel module, unless an operator
// ran --release-gpus by hand at the right moment. The plugin now follows
// the node's upgrade-state label: the states before the driver restart
// leave the GPUs in use, pod-restart-required releases them (the module
// then unloads) and keeps them released while it lasts, even with the
// driver back, and the next state reacquires them.
func TestGPUOperatorDriverRestartReleasesTheGPUs(t *testing.T) {
	m := newMaintEnv(t)
	state := followedUpgradeState(m, "")
	for _, s := range []string{"", "upgrade-required", "cordon-required", "wait-for-jobs-required", "pod-deletion-required", "drain-required"} {
		state.Store(s)
		m.driver.maint.Tick(m.Ctx)
		if m.driver.maint.Released() {
			t.Fatalf("GPUs released at upgrade state %q, before the driver restart", s)
		}
	}
	state.Store(maintenance.UpgradeStateDriverRestart)
	m.driver.maint.Tick(m.Ctx)
	if err := nvmock.UnloadDriver(m.MockStateDir); err != nil {
		t.Fatalf("the driver pod's unload at %s: %v", maintenance.UpgradeStateDriverRestart, err)
	}
	if tainted, all := m.taintedMaintenance(t); tainted != all || all == 0 {
		t.Errorf("%d of %d devices tainted %s during the driver restart, want all", tainted, all, maintenanceTaint)
	}
	if err := nvmock.LoadDriver(m.MockStateDir); err != nil {
		t.Fatal(err)
	}
	m.driver.maint.Tick(m.Ctx)
	if !m.driver.maint.Released() {
		t.Fatalf("GPUs taken back while the label still says %s", maintenance.UpgradeStateDriverRestart)
	}
	state.Store("validation-required")
	m.driver.maint.Tick(m.Ctx)
	if err := m.driver.NotReady(); err != nil {
		t.Fatalf("after the driver restart: %v", err)
	}
	if err := nvmock.UnloadDriver(m.MockStateDir); !errors.Is(err, nvmock.ErrDriverInUse) {
		t.Errorf("unload after reacquiring: %v, want the new session to hold the driver", err)
	}
	if err := m.prepare(t, "after", "gpu-4"); err != nil {
		t.Errorf("prepare after the upgrade: %v", err)
	}
}

// GPUs an operator released (a reset, say) are the operator's to take
// back: the upgrade moving on, or ending, does not reacquire them.
func TestUpgradeStateLeavesAnOperatorsReleaseAlone(t *testing.T) {
	m := newMaintEnv(t)
	state := followedUpgradeState(m, "")
	if err := m.driver.maint.Release(m.Ctx, "an operator's GPU reset"); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"upgrade-done", maintenance.UpgradeStateDriverRestart, "validation-required", ""} {
		state.Store(s)
		m.driver.maint.Tick(m.Ctx)
		if !m.driver.maint.Released() {
			t.Fatalf("an operator's release undone at upgrade state %q", s)
		}
	}
}
