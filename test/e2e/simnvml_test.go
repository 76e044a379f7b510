package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/gpuaas/gpu-dra-driver/hack/nvmlshim/shimbuild"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev/nvmock"
	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

// TestSimulatedNVMLLibrary runs the plugin's production NVML path,
// --nvml real (go-nvml dlopening libnvidia-ml.so.1 from the driver root),
// on the simulated library (hack/nvmlshim) over the demo node's 8 x H100:
// it publishes what the in-process mock's plugin publishes for the same
// node config, prepares and unprepares every device kind of the demo node
// (dynamic MIG: GPU and compute instances made and destroyed through the
// library) while being SIGKILLed at random and started again, leaks
// nothing, and taints a GPU for an XID injected as mocknvml does, which it
// receives through NVML's events.
func TestSimulatedNVMLLibrary(t *testing.T) {
	lib, took, err := shimbuild.Library(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	if took > 0 {
		t.Logf("built the simulated NVML library in %s", took.Round(time.Second))
	}
	config := filepath.Join(repoRoot, "demo", "node-config.yaml")
	mocked := startNodeWith(t, framework.NodeOptions{Name: nodeName(t) + "-mock", NodeConfig: config})
	node := startNodeWith(t, framework.NodeOptions{Name: nodeName(t), NodeConfig: config, NVMLLibrary: lib})
	ctx := framework.Context(t, 10*time.Minute)

	want := publishedShape(t, ctx, mocked)
	got := publishedShape(t, ctx, node)
	if !slices.Equal(got, want) {
		t.Errorf("published through the library (%d devices) differs from the mock's (%d):\n%s",
			len(got), len(want), firstDifference(got, want))
	}
	t.Logf("%d devices published through --nvml real on the simulated library, as through the mock", len(got))
	if err := mocked.Stop(ctx); err != nil {
		t.Fatal(err)
	}

	run := startCrashRun(t, node, "simulated NVML crash e2e", 12)
	// One dynamic MIG device for sure: made at prepare, gone at unprepare,
	// both through the library.
	stateDir := filepath.Join(node.PluginDataDir, "mock-nvml")
	createSelectedPod(t, run.ctx, run.ns, "mig", "mig-1g.10gb.gpuaas.io", "true")
	runningPod(t, run.ctx, run.ns, "mig")
	if gis, _ := mockMachineLeaks(t, stateDir); gis != 1 {
		t.Errorf("a running pod with a dynamic MIG device: %d GPU instances on the machine, want 1", gis)
	}
	deletePod(t, run.ctx, run.ns, "mig")
	if gis, _ := mockMachineLeaks(t, stateDir); gis != 0 {
		t.Errorf("the MIG pod gone: %d GPU instances left", gis)
	}
	kills := killRandomly(t, run.ctx, node, run.seed)
	runPodCycles(t, run.ctx, run.ns, run.cycles, rand.New(rand.NewPCG(run.seed, 1)), crashKinds)
	n := kills.stop()
	// The last restart may still be starting: an XID logged before its
	// health monitor registers for events is never delivered, as in NVML.
	waitPluginStarted(t, ctx, node)
	leaks := map[string]int{}
	err = wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		leaks = crashLeaks(t, node, run.tsUUID)
		return len(leaks) == 0, nil
	})
	t.Logf("%d pod cycles, %d SIGKILLs of the plugin, leaks %v", run.cycles, n, leaks)
	if err != nil {
		t.Errorf("left behind after every claim was unprepared: %v", leaks)
	}
	if n == 0 {
		t.Error("the plugin was never killed")
	}

	// XID 48 (a double-bit ECC error: reset required) on GPU 0.
	if err := nvmock.InjectEvent(stateDir, "0", nvml.EventTypeXidCriticalError, 48, nvmock.WholeGPU, nvmock.WholeGPU); err != nil {
		t.Fatal(err)
	}
	var tainted []string
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		tainted = nil
		devices, err := node.WaitForDevices(ctx, 1)
		if err != nil {
			return false, err
		}
		for _, d := range devices {
			for _, taint := range d.Taints {
				if taint.Key == framework.DriverName+"/xid" {
					tainted = append(tainted, d.Name)
				}
			}
		}
		return slices.Contains(tainted, "gpu-0"), nil
	})
	if err != nil {
		t.Fatalf("GPU 0 not tainted for XID 48 (tainted: %v): %v", tainted, err)
	}
	for _, d := range tainted {
		if !strings.HasPrefix(d, "gpu-0") {
			t.Errorf("device %s of another GPU tainted for GPU 0's XID", d)
		}
	}
	// Every NVML call the plugin made is one the library implements.
	logData, err := os.ReadFile(node.Plugin.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(logData)) {
		if strings.Contains(line, "not supported by the simulated machine") {
			t.Errorf("the plugin called a stub: %s", strings.TrimSpace(line))
		}
	}
}

// publishedShape is each published device with its attributes and
// capacity, less what differs between nodes (UUIDs derive from the node
// name) or between the backends by design (the real backend reads the
// PCIe root from sysfs, which has no simulated GPUs).
func publishedShape(t *testing.T, ctx context.Context, node *framework.Node) []string {
	t.Helper()
	devices, err := node.WaitForDevices(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, d := range devices {
		out = append(out, deviceShape(d))
	}
	slices.Sort(out)
	return out
}

func deviceShape(d resourceapi.Device) string {
	var attrs []string
	for name, v := range d.Attributes {
		switch string(name) {
		case "uuid", "parentUUID", "resource.kubernetes.io/pcieRoot":
			continue
		}
		attrs = append(attrs, fmt.Sprintf("%s=%v", name, attrValue(v)))
	}
	for name, c := range d.Capacity {
		attrs = append(attrs, fmt.Sprintf("%s=%s", name, c.Value.String()))
	}
	slices.Sort(attrs)
	return d.Name + " " + strings.Join(attrs, " ")
}

func attrValue(v resourceapi.DeviceAttribute) any {
	switch {
	case v.StringValue != nil:
		return *v.StringValue
	case v.IntValue != nil:
		return *v.IntValue
	case v.BoolValue != nil:
		return *v.BoolValue
	case v.VersionValue != nil:
		return *v.VersionValue
	}
	return nil
}

func firstDifference(got, want []string) string {
	for i := range min(len(got), len(want)) {
		if got[i] != want[i] {
			return fmt.Sprintf("library: %s\nmock:    %s", got[i], want[i])
		}
	}
	return fmt.Sprintf("lengths %d and %d", len(got), len(want))
}

// waitPluginStarted waits until the plugin's newest process logged that it
// started, which it does once its health monitor watches for events.
func waitPluginStarted(t *testing.T, ctx context.Context, node *framework.Node) {
	t.Helper()
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		data, err := os.ReadFile(node.Plugin.LogPath)
		if err != nil {
			return false, err
		}
		log := string(data)
		last := strings.LastIndex(log, `step="opening NVML"`)
		return last >= 0 && strings.Contains(log[last:], "Kubelet plugin started"), nil
	})
	if err != nil {
		t.Fatalf("the plugin's last start did not finish (log %s): %v", node.Plugin.LogPath, err)
	}
}
