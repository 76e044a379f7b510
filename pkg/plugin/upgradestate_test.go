package plugin

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev/nvmock"
)

// followedUpgradeState makes the plugin follow a stand-in for its node's
// GPU Operator upgrade-state label, set by the test.
func followedUpgradeState(m *maintEnv, initial string) *atomic.Value {
	var state atomic.Value
	state.Store(initial)
	m.driver.maint.opts.UpgradeState = func() string { return state.Load().(string) }
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
		m.driver.driverTick(m.ctx)
		if m.driver.maint.isReleased() {
			t.Fatalf("GPUs released at upgrade state %q, before the driver restart", s)
		}
	}
	state.Store(upgradeStateDriverRestart)
	m.driver.driverTick(m.ctx)
	if err := nvmock.UnloadDriver(m.mockStateDir); err != nil {
		t.Fatalf("the driver pod's unload at %s: %v", upgradeStateDriverRestart, err)
	}
	if tainted, all := m.taintedMaintenance(t); tainted != all || all == 0 {
		t.Errorf("%d of %d devices tainted %s during the driver restart, want all", tainted, all, maintenanceTaint)
	}
	if err := nvmock.LoadDriver(m.mockStateDir); err != nil {
		t.Fatal(err)
	}
	m.driver.driverTick(m.ctx)
	if !m.driver.maint.isReleased() {
		t.Fatalf("GPUs taken back while the label still says %s", upgradeStateDriverRestart)
	}
	state.Store("validation-required")
	m.driver.driverTick(m.ctx)
	if err := m.driver.NotReady(); err != nil {
		t.Fatalf("after the driver restart: %v", err)
	}
	if err := nvmock.UnloadDriver(m.mockStateDir); !errors.Is(err, nvmock.ErrDriverInUse) {
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
	if err := m.driver.Release(m.ctx, "an operator's GPU reset"); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"upgrade-done", upgradeStateDriverRestart, "validation-required", ""} {
		state.Store(s)
		m.driver.driverTick(m.ctx)
		if !m.driver.maint.isReleased() {
			t.Fatalf("an operator's release undone at upgrade state %q", s)
		}
	}
}

// The watch reads the label of the plugin's own node and follows it.
func TestWatchUpgradeStateFollowsTheNodesLabel(t *testing.T) {
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: testNode, Labels: map[string]string{UpgradeStateLabel: "upgrade-required"}}}
	client := fake.NewClientset(node)
	ctx := t.Context()
	read := WatchUpgradeState(ctx, client, testNode)
	waitState := func(want string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for read() != want {
			if time.Now().After(deadline) {
				t.Fatalf("upgrade state %q, want %q", read(), want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitState("upgrade-required")
	node = node.DeepCopy()
	node.Labels[UpgradeStateLabel] = upgradeStateDriverRestart
	if _, err := client.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitState(upgradeStateDriverRestart)
	delete(node.Labels, UpgradeStateLabel)
	if _, err := client.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitState("")
}
