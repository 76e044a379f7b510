package e2e

import (
	"context"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev/nvmock"
	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

// dynamicMIGGPUs are the dynamic-MIG GPUs of the node the test runs: the
// demo node's (6, 7) and those it offers whole (0-3), so that whole-GPU
// pods switch MIG mode off where MIG pods switched it on, and back.
var dynamicMIGGPUs = []string{"0", "1", "2", "3", "6", "7"}

// dynamicNodeConfig is the demo node's configuration with GPUs 0-3 in
// dynamic MIG mode too.
func dynamicNodeConfig(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot, "demo", "node-config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	const demo = "- indexes: [6, 7]\n  mig: dynamic"
	if !strings.Contains(string(data), demo) {
		t.Fatalf("demo/node-config.yaml no longer offers GPUs 6 and 7 as dynamic MIG (%q)", demo)
	}
	path := filepath.Join(t.TempDir(), "node-config.yaml")
	config := strings.Replace(string(data), demo, "- indexes: [0, 1, 2, 3, 6, 7]\n  mig: dynamic", 1)
	if err := os.WriteFile(path, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// Issue 25 (Must show): TestPluginSIGKILLLeaksNothing with real hardware's
// behaviour on the simulated GPUs, six of them in dynamic MIG mode, which
// whole-GPU and MIG pods switch back and forth: instance creation is slow,
// each MIG mode switch re-binds the GPU with a new minor number,
// and from outside the plugin (as dcgm-exporter or the other plugin pod
// would) switches are refused as in use for a while, or left pending a
// reset for a second (claims fail meanwhile; the kubelet retries). Every
// pod runs in the end, and when all are gone nothing is left, nor any MIG
// mode pending a reset.
func TestPluginSIGKILLLeaksNothingWithHardwareFaults(t *testing.T) {
	node := startNodeWith(t, framework.NodeOptions{Name: nodeName(t), NodeConfig: dynamicNodeConfig(t)})
	stateDir := filepath.Join(node.PluginDataDir, "mock-nvml")
	run := startCrashRun(t, node, "crash e2e with hardware faults", 45)
	ctx, ns, seed, cycles, tsUUID := run.ctx, run.ns, run.seed, run.cycles, run.tsUUID
	if err := nvmock.SetCreateDelay(stateDir, 50*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	for _, gpu := range dynamicMIGGPUs {
		if err := nvmock.SetRebindOnMigMode(stateDir, gpu, true); err != nil {
			t.Fatal(err)
		}
	}
	begin := time.Now()

	faults := injectModeFaults(t, ctx, stateDir, seed)
	kills := killRandomly(t, ctx, node, seed)
	runPodCycles(t, ctx, ns, cycles, rand.New(rand.NewPCG(seed, 1)), crashKinds)
	n := kills.stop()
	injected := faults.stop()

	leaks := map[string]int{}
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		leaks = crashLeaks(t, node, tsUUID)
		if p := pendingModes(t, stateDir); p > 0 {
			leaks["MIG modes pending a reset"] = p
		}
		return len(leaks) == 0, nil
	})
	t.Logf("crash e2e with hardware faults: %d pod cycles, %d SIGKILLs of the plugin, %d faults injected, %d GPUs re-bound on a new minor, leaks %v, %.0fs",
		cycles, n, injected, rebound(t, stateDir), leaks, time.Since(begin).Seconds())
	if err != nil {
		t.Errorf("left behind after every claim was unprepared: %v", leaks)
	}
	if n == 0 || injected == 0 {
		t.Errorf("%d kills, %d faults injected: nothing was tested", n, injected)
	}
}

// injectModeFaults refuses the dynamic-MIG GPUs' MIG mode switches as in
// use (one to three times) or leaves them pending a reset (for a second),
// at random moments, until stopped; stopping ends every such fault.
func injectModeFaults(t *testing.T, ctx context.Context, stateDir string, seed uint64) *killer {
	ctx, cancel := context.WithCancel(ctx)
	k := &killer{cancel: cancel, done: make(chan struct{})}
	rng := rand.New(rand.NewPCG(seed, 7))
	go func() {
		defer close(k.done)
		defer func() {
			for _, gpu := range dynamicMIGGPUs {
				if err := nvmock.SetMigModePending(stateDir, gpu, false); err != nil {
					t.Errorf("ending the pending fault: %v", err)
				}
				if err := nvmock.SetMigModeInUse(stateDir, gpu, 0); err != nil {
					t.Errorf("ending the in-use fault: %v", err)
				}
			}
		}()
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Duration(200+rng.IntN(800)) * time.Millisecond):
			}
			gpu := dynamicMIGGPUs[rng.IntN(len(dynamicMIGGPUs))]
			var err error
			if rng.IntN(3) == 0 {
				err = nvmock.SetMigModePending(stateDir, gpu, true)
				if err == nil {
					select {
					case <-ctx.Done():
					case <-time.After(time.Second):
					}
					err = nvmock.SetMigModePending(stateDir, gpu, false)
				}
			} else {
				err = nvmock.SetMigModeInUse(stateDir, gpu, 1+rng.IntN(3))
			}
			if err != nil {
				t.Errorf("injecting a MIG mode fault on GPU %s: %v", gpu, err)
				return
			}
			k.kills.Add(1)
		}
	}()
	return k
}

// mockGPUStates reads the GPUs of the simulated machine's state file.
func mockGPUStates(t *testing.T, stateDir string) []struct {
	Pending *int `json:"pendingMigMode"`
	Minor   *int `json:"minor"`
} {
	t.Helper()
	var state struct {
		GPUs []struct {
			Pending *int `json:"pendingMigMode"`
			Minor   *int `json:"minor"`
		} `json:"gpus"`
	}
	readMockMachineState(t, stateDir, &state)
	return state.GPUs
}

// rebound counts the GPUs on another minor number than at boot.
func rebound(t *testing.T, stateDir string) int {
	t.Helper()
	n := 0
	for _, g := range mockGPUStates(t, stateDir) {
		if g.Minor != nil {
			n++
		}
	}
	return n
}

// pendingModes counts the GPUs of the simulated machine whose MIG mode
// waits for a reset.
func pendingModes(t *testing.T, stateDir string) int {
	t.Helper()
	n := 0
	for i, g := range mockGPUStates(t, stateDir) {
		if g.Pending != nil {
			t.Logf("GPU %d: MIG mode %d pending", i, *g.Pending)
			n++
		}
	}
	return n
}
