package e2e

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

// crashKinds are the device kinds of the demo node that the crash test
// prepares.
var crashKinds = []crashKind{
	{"whole", "gpu.gpuaas.io", ""},
	{"dynamic MIG", "mig-1g.10gb.gpuaas.io", ""},
	{"replica (Long interval)", "timeslice.gpuaas.io", onLongGPU},
	{"MPS share", "shared.gpuaas.io", onMPSGPU},
}

// TestPluginSIGKILLLeaksNothing: the real plugin binary is killed with
// SIGKILL at random moments while pods of every device kind of the demo
// node come and go (prepares and unprepares in flight), and started again
// each time, as the kubelet restarts a container that died. Every pod
// runs in the end, and when all are gone nothing is left: no CDI spec, no
// checkpoint record, no MIG device on the simulated GPUs (whose state
// outlives the plugin process), no MPS daemon, no GPU in exclusive-process
// mode, no time-slice interval left set. CRASH_E2E_CYCLES (default 120)
// and CRASH_E2E_SEED replay or lengthen it.
func TestPluginSIGKILLLeaksNothing(t *testing.T) {
	node := startNode(t)
	run := startCrashRun(t, node, "crash e2e", 120)
	ctx, ns, seed, cycles, tsUUID := run.ctx, run.ns, run.seed, run.cycles, run.tsUUID
	begin := time.Now()

	kills := killRandomly(t, ctx, node, seed)
	runPodCycles(t, ctx, ns, cycles, rand.New(rand.NewPCG(seed, 1)), crashKinds)
	n := kills.stop()

	// The last restart may still be restoring: let it finish its cleanup.
	leaks := map[string]int{}
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		leaks = crashLeaks(t, node, tsUUID)
		return len(leaks) == 0, nil
	})
	t.Logf("crash e2e: %d pod cycles over %v, %d SIGKILLs of the plugin, leaks %v, %.0fs",
		cycles, kindNames(), n, leaks, time.Since(begin).Seconds())
	if err != nil {
		t.Errorf("left behind after every claim was unprepared: %v", leaks)
	}
	if n == 0 {
		t.Error("the plugin was never killed: nothing was tested")
	}
}

// crashKind is a device kind the crash tests claim: a class and a CEL
// selector (empty: any device of the class).
type crashKind struct{ name, class, cel string }

// runPodCycles runs cycles pods, three at a time, of random kinds: each
// batch is created, runs, and is deleted.
func runPodCycles(t *testing.T, ctx context.Context, ns string, cycles int, rng *rand.Rand, kinds []crashKind) {
	t.Helper()
	for i := 0; i < cycles; i += 3 {
		var batch []string
		for j := i; j < min(i+3, cycles); j++ {
			kind := kinds[rng.IntN(len(kinds))]
			name := fmt.Sprintf("c%d", j)
			createSelectedPod(t, ctx, ns, name, kind.class, cmp.Or(kind.cel, "true"))
			batch = append(batch, name)
		}
		for _, name := range batch {
			runningPod(t, ctx, ns, name)
		}
		for _, name := range batch {
			deletePod(t, ctx, ns, name)
		}
	}
}

func kindNames() []string {
	var out []string
	for _, k := range crashKinds {
		out = append(out, k.name)
	}
	return out
}

// envInt reads a number from the environment, def when unset.
func envInt(tb testing.TB, name string, def int) int {
	tb.Helper()
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		tb.Fatalf("%s=%q: %v", name, s, err)
	}
	return n
}

// killer kills the plugin at random intervals until stopped.
type killer struct {
	cancel context.CancelFunc
	done   chan struct{}
	kills  atomic.Int64
}

func killRandomly(t *testing.T, ctx context.Context, node *framework.Node, seed uint64) *killer {
	ctx, cancel := context.WithCancel(ctx)
	k := &killer{cancel: cancel, done: make(chan struct{})}
	rng := rand.New(rand.NewPCG(seed, 99))
	go func() {
		defer close(k.done)
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Duration(50+rng.IntN(750)) * time.Millisecond):
			}
			if err := node.KillPlugin(ctx); err != nil && ctx.Err() == nil {
				t.Errorf("restarting the killed plugin: %v", err)
				return
			}
			k.kills.Add(1)
		}
	}()
	return k
}

func (k *killer) stop() int64 {
	k.cancel()
	<-k.done
	return k.kills.Load()
}

// crashLeaks counts what no claim explains any more.
func crashLeaks(t *testing.T, node *framework.Node, tsUUID string) map[string]int {
	t.Helper()
	leaks := map[string]int{}
	count := func(what, pattern string) {
		if m, _ := filepath.Glob(pattern); len(m) > 0 {
			leaks[what] = len(m)
		}
	}
	count("CDI specs", filepath.Join(node.CDIRoot, "k8s."+framework.DriverName+"-*"))
	count("checkpoint records", filepath.Join(node.PluginDataDir, "claims", "*"))
	count("MPS daemons", filepath.Join(node.PluginDataDir, "mps", "*", "pipe", "nvidia-cuda-mps-control.pid"))
	count("MPS directories", filepath.Join(node.PluginDataDir, "mps", "*"))
	gis, exclusive := mockMachineLeaks(t, filepath.Join(node.PluginDataDir, "mock-nvml"))
	if gis > 0 {
		leaks["MIG devices"] = gis
	}
	if exclusive > 0 {
		leaks["GPUs in exclusive-process mode"] = exclusive
	}
	if interval := lastInterval(t, node.ToolCalls, tsUUID); interval != "0" {
		leaks["time-slice interval left at "+interval] = 1
	}
	return leaks
}

// mockMachineLeaks counts the GPU instances and the GPUs not in the default
// compute mode in a simulated machine's state file.
func mockMachineLeaks(t *testing.T, stateDir string) (gpuInstances, exclusive int) {
	t.Helper()
	var state struct {
		GPUs []struct {
			ComputeMode  nvml.ComputeMode  `json:"computeMode"`
			GPUInstances []json.RawMessage `json:"gpuInstances"`
		} `json:"gpus"`
	}
	readMockMachineState(t, stateDir, &state)
	for _, g := range state.GPUs {
		gpuInstances += len(g.GPUInstances)
		if g.ComputeMode != nvml.COMPUTEMODE_DEFAULT {
			exclusive++
		}
	}
	return gpuInstances, exclusive
}

// readMockMachineState decodes the one simulated machine's state file in
// stateDir into state.
func readMockMachineState(t *testing.T, stateDir string, state any) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(stateDir, "mock-*.json"))
	if err != nil || len(files) != 1 {
		t.Fatalf("want one mock machine state file in %s, found %v (%v)", stateDir, files, err)
	}
	data, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, state); err != nil {
		t.Fatalf("mock machine state %s: %v", files[0], err)
	}
}

// lastInterval is the time-slice interval nvidia-smi last set on a GPU
// ("0" when never set: Default).
func lastInterval(t *testing.T, callLog, uuid string) string {
	t.Helper()
	calls, err := framework.ReadToolCalls(callLog)
	if err != nil {
		t.Fatal(err)
	}
	last := "0"
	for _, c := range calls {
		if len(c.Args) == 4 && c.Tool == "nvidia-smi" && c.Args[2] == uuid {
			last = c.Args[3][len("--set-timeslice="):]
		}
	}
	return last
}

// crashRun is what a crash test works with: the seed and cycles
// (CRASH_E2E_SEED and CRASH_E2E_CYCLES replay or lengthen it), the demo's
// catalog and the sharing classes applied, a namespace, and the UUID of the
// GPU whose time-slice interval is set long.
type crashRun struct {
	ctx    context.Context
	ns     string
	seed   uint64
	cycles int
	tsUUID string
}

func startCrashRun(t *testing.T, node *framework.Node, what string, defaultCycles int) crashRun {
	t.Helper()
	r := crashRun{cycles: envInt(t, "CRASH_E2E_CYCLES", defaultCycles), seed: uint64(time.Now().UnixNano())}
	if s := os.Getenv("CRASH_E2E_SEED"); s != "" {
		r.seed = uint64(envInt(t, "CRASH_E2E_SEED", 0))
	}
	t.Logf("%s, seed %d (CRASH_E2E_SEED replays it), %d cycles", what, r.seed, r.cycles)
	r.ctx = framework.Context(t, 10*time.Minute)
	if _, err := cp.Apply(r.ctx, filepath.Join(repoRoot, "demo", "specs", "00-catalog"), ""); err != nil {
		t.Fatal(err)
	}
	applySharingClasses(t, r.ctx)
	r.ns = cp.CreateNamespace(t, "crash")
	r.tsUUID = gpuUUIDOf(t, r.ctx, node.Name, longIntervalGPU)
	return r
}
