package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/gpuaas/gpu-dra-driver/pkg/mps"
	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

// The demo node's sharing GPUs (demo/node-config.yaml): GPU 4 time-sliced
// with the Long interval, GPU 5 shared with MPS.
const (
	longIntervalGPU = 4
	mpsGPU          = 5
	// onLongGPU and onMPSGPU select their devices by the published
	// settings, as a user would.
	onLongGPU = `device.attributes["gpu.gpuaas.io"].timeSliceInterval == "Long"`
	onMPSGPU  = `device.attributes["gpu.gpuaas.io"].sharingStrategy == "MPS"`
)

// toolCall describes a call of the stand-in tools that a test waits for.
type toolCall struct {
	tool  string
	args  []string // nil: any
	stdin string   // "": any
	env   map[string]string
}

func (w toolCall) String() string {
	return fmt.Sprintf("%s %v stdin %q env %v", w.tool, w.args, w.stdin, w.env)
}

func (w toolCall) matches(c framework.ToolCall) bool {
	if c.Tool != w.tool || (w.args != nil && !slices.Equal(c.Args, w.args)) || (w.stdin != "" && c.Stdin != w.stdin) {
		return false
	}
	for k, v := range w.env {
		if c.Env[k] != v {
			return false
		}
	}
	return true
}

// waitToolCall waits until the call log holds a call like want and
// returns it.
func waitToolCall(t *testing.T, ctx context.Context, callLog string, want toolCall) framework.ToolCall {
	t.Helper()
	var found framework.ToolCall
	var calls []framework.ToolCall
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		var err error
		if calls, err = framework.ReadToolCalls(callLog); err != nil {
			return false, err
		}
		for _, c := range calls {
			if want.matches(c) {
				found = c
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("no call %s of the driver tools: %v; calls:\n%v", want, err, calls)
	}
	return found
}

// setTimeslice is nvidia-smi setting a GPU's interval (3 = Long).
func setTimeslice(uuid string, n int) toolCall {
	return toolCall{tool: "nvidia-smi", args: []string{"compute-policy", "-i", uuid, fmt.Sprintf("--set-timeslice=%d", n)}}
}

// mpsControl is a client call of nvidia-cuda-mps-control to a GPU's daemon.
func mpsControl(uuid, stdin string) toolCall {
	return toolCall{tool: "nvidia-cuda-mps-control", args: []string{}, stdin: stdin, env: map[string]string{"CUDA_VISIBLE_DEVICES": uuid}}
}

// checkDriverLibraries checks that a tool ran with the driver root's NVML
// preloaded, where the root has one, and with no library path: a path
// over the root's directories loaded its libc under the plugin image's
// loader.
func checkDriverLibraries(t *testing.T, c framework.ToolCall, driverRoot string) {
	t.Helper()
	if ld, ok := c.Env["LD_LIBRARY_PATH"]; ok {
		t.Errorf("%s ran with LD_LIBRARY_PATH=%s: the driver root's libc mixed with the plugin's", c, ld)
	}
	nvml := filepath.Join(driverRoot, "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1")
	want := ""
	if _, err := os.Stat(nvml); err == nil {
		want = nvml
	}
	if c.Env["LD_PRELOAD"] != want {
		t.Errorf("%s ran with LD_PRELOAD=%q, want %q", c, c.Env["LD_PRELOAD"], want)
	}
}

// waitDaemonLog waits until the MPS daemon of a GPU logged a line with
// want in the GPU's log directory (the stand-in logs as the real one).
func waitDaemonLog(t *testing.T, ctx context.Context, mpsDir, uuid, want string) {
	t.Helper()
	path := filepath.Join((&mps.Daemons{Dir: mpsDir}).LogDir(uuid), "control.log")
	var data []byte
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		data, _ = os.ReadFile(path)
		return strings.Contains(string(data), want), nil
	})
	if err != nil {
		t.Fatalf("MPS daemon of %s did not log %q: %v\n%s", uuid, want, err, data)
	}
}

// gpuUUIDOf is the UUID of a node's GPU, from its published devices.
func gpuUUIDOf(t *testing.T, ctx context.Context, node string, index int64) string {
	t.Helper()
	devices := devicesOfGPUIndex(t, ctx, node, index)
	if len(devices) == 0 {
		t.Fatalf("node %s publishes no device of GPU %d", node, index)
	}
	if p := stringAttr(devices[0], "parentUUID"); p != "" {
		return p
	}
	return stringAttr(devices[0], "uuid")
}

// devicesOfGPUIndex are the devices node publishes of the GPU at index.
func devicesOfGPUIndex(t *testing.T, ctx context.Context, node string, index int64) []resourceapi.Device {
	t.Helper()
	devices, err := cp.PoolDevices(ctx, node)
	if err != nil {
		t.Fatal(err)
	}
	var of []resourceapi.Device
	for _, d := range devices {
		if i, ok := intAttr(d, "index"); ok && i == index {
			of = append(of, d)
		}
	}
	return of
}

// TestSharingToolsOnSimulatedNode (issue 11 items 6 and 10): on the demo
// node, a pod on a replica of the Long-interval GPU and a pod with an MPS
// share run; the driver tools (stand-ins in the node's driver root) were
// asked to set the interval and to start and check the GPU's MPS daemon,
// with the driver's libraries; the daemon served; unpreparing reset the
// interval and stopped the daemon.
func TestSharingToolsOnSimulatedNode(t *testing.T) {
	node := startNode(t)
	ctx := framework.Context(t, 3*time.Minute)
	applySharingClasses(t, ctx)
	ns := cp.CreateNamespace(t, "sharing-tools")
	tsUUID := gpuUUIDOf(t, ctx, node.Name, longIntervalGPU)
	mpsUUID := gpuUUIDOf(t, ctx, node.Name, mpsGPU)
	mpsDir := filepath.Join(node.PluginDataDir, "mps")

	createSelectedPod(t, ctx, ns, "long", "timeslice.gpuaas.io", onLongGPU)
	createSelectedPod(t, ctx, ns, "mps", "shared.gpuaas.io", onMPSGPU)
	for _, name := range []string{"long", "mps"} {
		pod := runningPod(t, ctx, ns, name)
		checkPrepared(t, node, pod, onlyClaim(t, ctx, pod))
	}
	checkDriverLibraries(t, waitToolCall(t, ctx, node.ToolCalls, setTimeslice(tsUUID, 3)), node.DriverRoot)
	start := waitToolCall(t, ctx, node.ToolCalls, toolCall{tool: "nvidia-cuda-mps-control", args: []string{"-d"},
		env: map[string]string{"CUDA_VISIBLE_DEVICES": mpsUUID, "CUDA_MPS_PIPE_DIRECTORY": (&mps.Daemons{Dir: mpsDir}).PipeDir(mpsUUID)}})
	checkDriverLibraries(t, start, node.DriverRoot)
	waitToolCall(t, ctx, node.ToolCalls, mpsControl(mpsUUID, "get_default_active_thread_percentage\n"))
	waitDaemonLog(t, ctx, mpsDir, mpsUUID, "Starting control daemon on GPUs "+mpsUUID)

	deletePod(t, ctx, ns, "long")
	deletePod(t, ctx, ns, "mps")
	waitToolCall(t, ctx, node.ToolCalls, setTimeslice(tsUUID, 0))
	waitToolCall(t, ctx, node.ToolCalls, mpsControl(mpsUUID, "quit\n"))
	if err := waitGone(ctx, (&mps.Daemons{Dir: mpsDir}).GPUDir(mpsUUID)); err != nil {
		t.Errorf("the MPS directories of %s are left after its last claim: %v", mpsUUID, err)
	}
}
