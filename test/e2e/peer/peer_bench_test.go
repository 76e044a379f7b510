package peer

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"

	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
	"github.com/gpuaas/gpu-dra-driver/test/fleet"
)

// Measurement sizes. samples is per driver and per level of prepared
// claims: its p99 is close to its maximum, and says so in the table.
const (
	samples    = 50
	concurrent = 8 // one claim per GPU of the 8 x H100
	rounds     = 10
)

// measured is the whole GPU every serial sample prepares: no background
// claim holds it exclusively.
const measured = "gpu-7"

var gpus = []string{"gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-5", "gpu-6", "gpu-7"}

// BenchmarkPeer runs both plugins on one simulated 8 x H100 node (the same
// node name, so the same pool name, each with its own driver name) and
// prints one side-by-side table. Run it once: `make bench-peer`, or
//
//	PEER_NVIDIA_PLUGIN=<gpu-kubelet-plugin> E2E_REQUIRED=1 go test ./test/e2e/peer -run '^$' -bench Peer -benchtime 1x -timeout 110m -v
func BenchmarkPeer(b *testing.B) {
	if cp == nil {
		b.Skipf("%s is not set: NVIDIA's plugin is not built (make bench-peer)", envPlugin)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Minute)
	defer cancel()
	loadBefore := loadavg()
	p := startBoth(ctx, b, "peer-node")
	node, gpuaas, nv := p.node, p.gpuaas, p.nv
	drivers := []*driver{gpuaas, nv}
	t := &table{drivers: drivers}
	if err := runDynamicMIG(ctx, t); err != nil {
		t.print(os.Stdout)
		b.Fatal(err)
	}

	for _, d := range drivers {
		if err := measure(ctx, t, node, d); err != nil {
			t.print(os.Stdout) // what was measured before
			b.Fatalf("%v\n%s log %s:\n%s", err, d.label, d.proc.LogPath, d.proc.Tail(30))
		}
	}
	t.header = []string{
		fmt.Sprintf("gpuaas %s, NVIDIA %s, one node %q, simulated 8 x H100 (hack/nvmlshim), %d CPUs", gpuaas.version, nv.version, node.Name, numCPU()),
		fmt.Sprintf("load before %s, after %s (/proc/loadavg)", loadBefore, loadavg()),
	}
	t.print(os.Stdout)
}

// peerNode is one simulated 8 x H100 node with both plugins on it.
type peerNode struct {
	node       *framework.Node
	gpuaas, nv *driver
	stops      []func() // in the order started
}

// startPeerNode starts a simulated 8 x H100 node called name with our
// plugin (nodeConfig: its NodeConfig file, "" for whole GPUs) and
// NVIDIA's beside it (with its DynamicMIG gate when dynamicMIG). On an
// error it stops what it started.
func startPeerNode(ctx context.Context, name, nodeConfig string, dynamicMIG bool, version string) (*peerNode, error) {
	p := &peerNode{}
	node, err := cp.StartNode(ctx, framework.NodeOptions{
		Name: name, PluginBinary: pluginBinary, NVMLLibrary: nvmlLibrary,
		NVML: "mock:dgxh100", Verbosity: 1, NodeConfig: nodeConfig,
	})
	if err != nil {
		return nil, err
	}
	p.node = node
	p.stops = append(p.stops, func() { _ = node.Stop(context.WithoutCancel(ctx)) })
	if p.gpuaas, err = ours(ctx, node, version); err != nil {
		p.stop()
		return nil, err
	}
	p.stops = append(p.stops, p.gpuaas.close)
	if p.nv, err = startNVIDIA(ctx, node, os.Getenv(envPlugin), node.Plugin.Env, dynamicMIG); err != nil {
		p.stop()
		return nil, err
	}
	p.stops = append(p.stops, func() { p.nv.close(); _ = p.nv.proc.Stop() })
	return p, nil
}

// stop ends what startPeerNode started, last first.
func (p *peerNode) stop() {
	for i := len(p.stops) - 1; i >= 0; i-- {
		p.stops[i]()
	}
}

// startBoth is startPeerNode for a benchmark's whole-GPU node, with the
// claims' namespace; all of it stops when b ends.
func startBoth(ctx context.Context, b *testing.B, name string) *peerNode {
	p, err := startPeerNode(ctx, name, "", false, gitDescribe())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(p.stop)
	if err := createNamespace(ctx); err != nil {
		b.Fatal(err)
	}
	return p
}

// prefix names d's claims: object names are lower case.
func prefix(d *driver, what string) string { return strings.ToLower(d.label) + "-" + what }

// measure fills the table's column of d, in the order where the
// order does not matter, and otherwise as the claims accumulate: 0
// prepared, then 100 (and the restart with them), then 1,000.
func measure(ctx context.Context, t *table, node *framework.Node, d *driver) error {
	if err := measureSlices(ctx, t, node, d); err != nil {
		return err
	}
	if os.Getenv(envSlicesOnly) != "" {
		return nil
	}
	var background []*drapb.Claim
	for _, level := range []int{0, 100, 1000} {
		more, err := createClaims(ctx, d, prefix(d, fmt.Sprint("bg", level)), node.Name, gpus, level-len(background), true)
		if err != nil {
			return err
		}
		if err := d.prepareInBatches(ctx, more, 50); err != nil {
			return err
		}
		background = append(background, more...)
		fmt.Fprintf(os.Stderr, "peer: %s: %d claims prepared, measuring\n", d.label, len(background))
		if err := measureSerial(ctx, t, node, d, level); err != nil {
			return err
		}
		if os.Getenv(syscallsEnv) != "" {
			if err := measureSyscalls(ctx, t, node, d, level); err != nil {
				return err
			}
		}
		switch level {
		case 0:
			if err := measureConcurrent(ctx, t, node, d); err != nil {
				return err
			}
		case 100:
			if err := measureRestart(ctx, t, node, d, background[0]); err != nil {
				return err
			}
		}
	}
	return nil
}

// measureSlices records what d publishes for the node: slices, devices
// and their size as the API server stores them (protobuf).
// With PEER_SLICES_OUT it keeps them there too, for the scheduler's
// benchmark on kwok nodes that publish both shapes (test/e2e/scale,
// BenchmarkPeerShapes).
func measureSlices(ctx context.Context, t *table, node *framework.Node, d *driver) error {
	slices, devices, err := waitPool(ctx, d, node.Name, len(gpus))
	if err != nil {
		return err
	}
	bytes := 0
	for i := range slices {
		data, err := slices[i].Marshal()
		if err != nil {
			return fmt.Errorf("marshalling slice %s: %w", slices[i].Name, err)
		}
		bytes += len(data)
	}
	t.set("ResourceSlices (whole GPUs): count / devices", d, fmt.Sprintf("%d / %d", len(slices), devices), 0)
	t.set("ResourceSlices (whole GPUs): bytes, protobuf", d, strconv.Itoa(bytes), float64(bytes))
	if dir := os.Getenv(envSlicesOut); dir != "" {
		return fleet.WriteCapture(filepath.Join(dir, fleet.ShapeWholeGPU), d.name, slices)
	}
	return nil
}

// measureSerial prepares and unprepares one whole-GPU claim after another.
func measureSerial(ctx context.Context, t *table, node *framework.Node, d *driver, level int) error {
	return measureSerialOn(ctx, t, d, node, d, measured, fmt.Sprintf("whole GPU, %d prepared: ", level), fmt.Sprint("serial", level))
}

// measureSerialOn prepares and unprepares one claim of device after
// another with d, into column col's rows that start with row; what names
// the claims.
func measureSerialOn(ctx context.Context, t *table, col *driver, node *framework.Node, d *driver, device, row, what string) error {
	claims, err := createClaims(ctx, d, prefix(d, what), node.Name, []string{device}, samples, false)
	if err != nil {
		return err
	}
	var prep, unprep []time.Duration
	for _, c := range claims {
		p, err := d.prepare(ctx, c)
		if err != nil {
			return err
		}
		u, err := d.unprepare(ctx, c)
		if err != nil {
			return err
		}
		prep, unprep = append(prep, p), append(unprep, u)
	}
	t.setLatency(row+"prepare p50 / p99", col, prep)
	t.setLatency(row+"unprepare p50 / p99", col, unprep)
	return nil
}

// measureConcurrent prepares 8 claims at once, one per GPU and one call
// each, as 8 pods starting together; the wall time until all are prepared
// is one sample.
func measureConcurrent(ctx context.Context, t *table, node *framework.Node, d *driver) error {
	var walls []time.Duration
	for r := range rounds {
		claims, err := createClaims(ctx, d, prefix(d, fmt.Sprint("conc", r)), node.Name, gpus, concurrent, false)
		if err != nil {
			return err
		}
		wall, err := all(claims, func(c *drapb.Claim) error { _, err := d.prepare(ctx, c); return err })
		if err != nil {
			return err
		}
		walls = append(walls, wall)
		if _, err := all(claims, func(c *drapb.Claim) error { _, err := d.unprepare(ctx, c); return err }); err != nil {
			return err
		}
	}
	t.setLatency("8 prepares at once, 8 GPUs: wall p50 / p99", d, walls)
	return nil
}

// all runs f on every claim at once and returns the wall time.
func all(claims []*drapb.Claim, f func(*drapb.Claim) error) (time.Duration, error) {
	errs := make([]error, len(claims))
	var wg sync.WaitGroup
	start := time.Now()
	for i, c := range claims {
		wg.Go(func() { errs[i] = f(c) })
	}
	wg.Wait()
	wall := time.Since(start)
	for _, err := range errs {
		if err != nil {
			return wall, err
		}
	}
	return wall, nil
}

// restarts is how many times the restart rows kill and start each
// plugin: one restart is one sample, and a single one moved with the
// machine's load (121 ms to 1,734 ms for ours across runs).
const restarts = 10

// measureRestart kills d's plugin (SIGKILL, as a crash or an OOM kill) with
// its prepared claims and starts it again, restarts times: ready is when
// the kubelet sees it registered again and when it answers a prepare of a
// claim it already holds (which must not redo the work).
func measureRestart(ctx context.Context, t *table, node *framework.Node, d *driver, held *drapb.Claim) error {
	var registered, answered []time.Duration
	for range restarts {
		r, a, err := restartOnce(ctx, node, d, held)
		if err != nil {
			return err
		}
		registered, answered = append(registered, r), append(answered, a)
	}
	t.setLatency("restart, 100 prepared: start to registered p50 / p99", d, registered)
	t.setLatency("restart, 100 prepared: start to first prepare answered p50 / p99", d, answered)
	return nil
}

// restartOnce is one sample of measureRestart.
func restartOnce(ctx context.Context, node *framework.Node, d *driver, held *drapb.Claim) (registered, answered time.Duration, err error) {
	d.close()
	d.proc.Kill()
	start := time.Now()
	if err := d.proc.Start(); err != nil {
		return 0, 0, err
	}
	err = wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) {
		since, ok := node.Sim.PluginRegisteredSince(d.name)
		return ok && since.After(start), nil
	})
	if err != nil {
		return 0, 0, fmt.Errorf("%s did not register again: %w", d.label, err)
	}
	registered = time.Since(start)
	if err := d.dial(ctx); err != nil {
		return 0, 0, err
	}
	err = wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := d.prepare(ctx, held)
		return err == nil, nil
	})
	if err != nil {
		return 0, 0, fmt.Errorf("%s: no prepare answered after the restart: %w", d.label, err)
	}
	return registered, time.Since(start), nil
}

func gitDescribe() string {
	out, err := exec.Command("git", "-C", repoRoot, "describe", "--tags", "--always", "--dirty").Output()
	if err != nil {
		return "unknown (" + err.Error() + ")"
	}
	return strings.TrimSpace(string(out))
}

func loadavg() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	return strings.Join(strings.Fields(string(data))[:3], " ")
}

func numCPU() int {
	data, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return 0
	}
	return strings.Count(string(data), "\nprocessor") + 1
}

// percentile is the q-quantile of samples by the nearest-rank method.
func percentile(samples []time.Duration, q float64) time.Duration {
	s := slices.Clone(samples)
	slices.Sort(s)
	i := int(q*float64(len(s))+0.999999) - 1
	return s[max(0, min(i, len(s)-1))]
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond)) }
