package framework

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"

	"github.com/gpuaas/gpu-dra-driver/test/kubeletsim"
)

// DriverName is the DRA driver under test.
const DriverName = "gpu.gpuaas.io"

// nodeStartTimeout bounds starting a node: simulator, plugin, registration
// and the first ResourceSlices.
const nodeStartTimeout = 2 * time.Minute

// NodeOptions describe a simulated GPU node.
type NodeOptions struct {
	Name string
	// PluginBinary is the dra-kubelet-plugin executable.
	PluginBinary string
	// NVML is the plugin's --nvml; default "mock:dgxh100" (8 H100 GPUs).
	NVML string
	// Verbosity is the plugin's -v; default 4.
	Verbosity int
	// NodeConfig is the plugin's --node-config file; empty offers every
	// GPU whole.
	NodeConfig string
	// ExtraArgs are appended to the plugin's command line.
	ExtraArgs []string
	// Labels are added to the Node.
	Labels map[string]string
	// NVMLLibrary, when set, is the simulated libnvidia-ml.so.1
	// (hack/nvmlshim, shimbuild.Library): the plugin runs the production
	// path, --nvml real, on a driver root holding it, and the library
	// keeps the machine NVML names ("mock:<machine>") in the same state
	// directory the mock backend would, so hack/mocknvml and the tests'
	// injections reach it alike.
	NVMLLibrary string
	// Env is added to the plugin's environment, e.g. POD_NAMESPACE: the
	// namespace of its use Lease, which it renews only where it has one.
	Env []string
	// RunUnder is a command the plugin binary runs under, e.g.
	// {"qemu-aarch64-static", "-L", "<arm64 rootfs>"} for the release's
	// arm64 plugin on this amd64 machine; empty runs it directly.
	RunUnder []string
}

// Node is a simulated node: the kubelet simulator in this process and the
// real plugin binary as a child process, sharing a private directory tree
// in place of /var/lib/kubelet and /var/run/cdi.
type Node struct {
	Name string
	// RegistryDir, PluginDataDir, CDIRoot and DriverRoot are what the
	// plugin got as --registrar-dir, --plugin-data-dir, --cdi-root and
	// --driver-root; the driver root holds stand-ins for nvidia-smi and
	// nvidia-cuda-mps-control, which record their calls in ToolCalls.
	RegistryDir, PluginDataDir, CDIRoot, DriverRoot string
	ToolCalls                                       string
	Plugin                                          *Process
	Sim                                             *kubeletsim.Simulator

	cp      *ControlPlane
	cancel  context.CancelFunc
	simDone chan error
}

// StartNode starts the simulator and the plugin and waits until the plugin
// is registered and its devices are published.
func (cp *ControlPlane) StartNode(ctx context.Context, opts NodeOptions) (*Node, error) {
	if opts.NVML == "" {
		opts.NVML = "mock:dgxh100"
	}
	if opts.Verbosity == 0 {
		opts.Verbosity = 4
	}
	n, err := cp.newNode(ctx, opts)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, nodeStartTimeout)
	defer cancel()
	if err := n.start(ctx); err != nil {
		return nil, errors.Join(err, n.Stop(context.WithoutCancel(ctx)))
	}
	return n, nil
}

func (cp *ControlPlane) newNode(ctx context.Context, opts NodeOptions) (*Node, error) {
	// Numbered, not named, directories: a Unix socket path must stay
	// under 108 bytes.
	dir := filepath.Join(cp.Dir, "nodes", fmt.Sprint(cp.nodeCount.Add(1)))
	n := &Node{
		Name:          opts.Name,
		RegistryDir:   filepath.Join(dir, "registry"),
		PluginDataDir: filepath.Join(dir, "plugin"),
		CDIRoot:       filepath.Join(dir, "cdi"),
		DriverRoot:    filepath.Join(dir, "driver"),
		ToolCalls:     filepath.Join(dir, "tool-calls.jsonl"),
		cp:            cp,
	}
	for _, d := range []string{n.RegistryDir, n.PluginDataDir, n.CDIRoot} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			return nil, fmt.Errorf("creating %s: %w", d, err)
		}
	}
	// Only the tools: the plugin finds no driver libraries or device nodes
	// here, as under "/" of a machine without a GPU.
	if err := InstallFakeNVTools(ctx, n.DriverRoot, n.ToolCalls); err != nil {
		return nil, err
	}
	metrics, err := FreeAddr()
	if err != nil {
		return nil, err
	}
	stateDir := n.Machine().StateDir
	nvmlArgs := []string{
		// The simulated GPUs keep their state (MIG devices, modes) in a
		// file, so that it outlives the plugin process as a GPU's does.
		"--mock-nvml-state-dir", stateDir,
		"--nvml", opts.NVML,
	}
	var env []string
	if opts.NVMLLibrary != "" {
		if env, err = installNVMLLibrary(opts, n.DriverRoot, stateDir); err != nil {
			return nil, err
		}
		nvmlArgs = []string{"--nvml", "real"}
	}
	args := append([]string{
		"--node-name", opts.Name,
		"--kubeconfig", cp.Kubeconfig,
		"--plugin-data-dir", n.PluginDataDir,
		"--registrar-dir", n.RegistryDir,
		"--cdi-root", n.CDIRoot,
		"--driver-root", n.DriverRoot,
	}, nvmlArgs...)
	args = append(append(args,
		"--metrics-addr", metrics,
		"--healthcheck-addr=",
		// No kubelet runs pods here, so no daemon pod would ever start.
		"--mps-daemons=process",
		// The simulated kubelet serves no PodResources API, and no device
		// plugin runs here: without this each plugin warns it cannot tell.
		"--device-plugin-coexistence=off",
		"--node-config="+opts.NodeConfig,
		"-v", fmt.Sprint(opts.Verbosity),
	), opts.ExtraArgs...)
	bin := opts.PluginBinary
	if len(opts.RunUnder) > 0 {
		bin, args = opts.RunUnder[0], append(append(opts.RunUnder[1:len(opts.RunUnder):len(opts.RunUnder)], opts.PluginBinary), args...)
	}
	n.Plugin = NewProcess("plugin-"+opts.Name, bin, filepath.Join(cp.LogDir, "plugin-"+opts.Name+".log"), args...)
	n.Plugin.Env = append(env, opts.Env...)
	sim, err := kubeletsim.New(kubeletsim.Config{
		Client: cp.Client, NodeName: opts.Name, RegistryDir: n.RegistryDir, Labels: opts.Labels,
	})
	if err != nil {
		return nil, err
	}
	n.Sim = sim
	return n, nil
}

// installNVMLLibrary puts the simulated NVML library where --nvml real
// looks for it under the driver root, and returns the plugin's
// environment that chooses its machine and state directory.
func installNVMLLibrary(opts NodeOptions, driverRoot, stateDir string) ([]string, error) {
	machine, ok := strings.CutPrefix(opts.NVML, "mock:")
	if !ok {
		return nil, fmt.Errorf("a simulated NVML library simulates a mock machine, not NVML %q", opts.NVML)
	}
	dir := filepath.Join(driverRoot, "usr", "lib64")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	if err := os.Symlink(opts.NVMLLibrary, filepath.Join(dir, "libnvidia-ml.so.1")); err != nil {
		return nil, fmt.Errorf("installing the simulated NVML library: %w", err)
	}
	return []string{
		"GPUAAS_MOCK_NVML_MACHINE=" + machine,
		"GPUAAS_MOCK_NVML_STATE_DIR=" + stateDir,
		"GPUAAS_MOCK_NVML_SEED=" + opts.Name,
		"GPUAAS_MOCK_NVML_DRIVER_ROOT=" + driverRoot,
		// The plugin's log names every NVML call the library answers
		// with a NOT_SUPPORTED stub.
		"GPUAAS_MOCK_NVML_TRACE=1",
	}, nil
}

// start runs the simulator first (the plugin publishes ResourceSlices owned
// by the Node, so the Node must exist), then the plugin.
func (n *Node) start(ctx context.Context) error {
	// The simulator outlives ctx, which only bounds the start.
	simCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	simCtx = klog.NewContext(simCtx, klog.Background().WithName("kubeletsim"))
	n.cancel, n.simDone = cancel, make(chan error, 1)
	go func() { n.simDone <- n.Sim.Run(simCtx) }()
	select {
	case <-n.Sim.Synced():
	case err := <-n.simDone:
		n.simDone <- err
		return fmt.Errorf("node simulator %s: %w", n.Name, err)
	case <-ctx.Done():
		return fmt.Errorf("node simulator %s did not start: %w", n.Name, ctx.Err())
	}
	if err := n.cp.WaitForNodeSchedulable(ctx, n.Name); err != nil {
		return err
	}
	if err := n.Plugin.Start(); err != nil {
		return err
	}
	return n.waitForPlugin(ctx, time.Time{})
}

// waitForPlugin waits until a registration newer than after exists and the
// plugin published at least one device.
func (n *Node) waitForPlugin(ctx context.Context, after time.Time) error {
	err := wait.PollUntilContextCancel(ctx, pollInterval, true, func(ctx context.Context) (bool, error) {
		if exited, err := n.Plugin.Exited(); exited {
			return false, fmt.Errorf("plugin exited (%w); last log lines:\n%s", err, n.Plugin.Tail(30))
		}
		since, ok := n.Sim.PluginRegisteredSince(DriverName)
		return ok && since.After(after), nil
	})
	if err != nil {
		return fmt.Errorf("plugin on %s not registered (log %s): %w", n.Name, n.Plugin.LogPath, err)
	}
	if _, err := n.WaitForDevices(ctx, 1); err != nil {
		return err
	}
	return nil
}

// WaitForDevices waits until the node's pool is completely published (all
// slices of its newest generation) with at least min devices, and returns
// them.
func (n *Node) WaitForDevices(ctx context.Context, min int) ([]resourceapi.Device, error) {
	var devices []resourceapi.Device
	err := wait.PollUntilContextCancel(ctx, pollInterval, true, func(ctx context.Context) (bool, error) {
		var err error
		devices, err = n.cp.PoolDevices(ctx, n.Name)
		return len(devices) >= min, err
	})
	if err != nil {
		return nil, fmt.Errorf("node %s publishes %d devices, want at least %d (plugin log %s): %w", n.Name, len(devices), min, n.Plugin.LogPath, err)
	}
	return devices, nil
}

// ResourceSlices returns the node's slices of our driver.
func (n *Node) ResourceSlices(ctx context.Context) ([]resourceapi.ResourceSlice, error) {
	selector := fields.Set{resourceapi.ResourceSliceSelectorNodeName: n.Name, resourceapi.ResourceSliceSelectorDriver: DriverName}
	list, err := n.cp.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: selector.AsSelector().String()})
	if err != nil {
		return nil, fmt.Errorf("listing ResourceSlices of %s: %w", n.Name, err)
	}
	return list.Items, nil
}

// KillPlugin kills the plugin with SIGKILL and starts it again, as the
// kubelet restarts a container that died; it waits until the new process
// registered.
func (n *Node) KillPlugin(ctx context.Context) error {
	n.Plugin.Kill()
	killed := time.Now()
	if err := n.Plugin.Start(); err != nil {
		return err
	}
	return n.waitForPlugin(ctx, killed)
}

// RestartPlugin stops the plugin, starts it again and waits until it
// registered anew and publishes devices.
func (n *Node) RestartPlugin(ctx context.Context) error {
	if err := n.Plugin.Stop(); err != nil {
		return err
	}
	stopped := time.Now()
	if err := n.Plugin.Start(); err != nil {
		return err
	}
	return n.waitForPlugin(ctx, stopped)
}

// CDISpecPath is where the plugin writes the CDI spec of a claim.
func (n *Node) CDISpecPath(claimUID types.UID) string {
	return filepath.Join(n.CDIRoot, fmt.Sprintf("k8s.%s-claim_%s.json", DriverName, claimUID))
}

// CheckpointPath is the plugin's checkpoint file of a prepared claim.
func (n *Node) CheckpointPath(claimUID types.UID) string {
	return filepath.Join(n.PluginDataDir, "claims", string(claimUID)+".json")
}

// Stop ends the plugin and the simulator, then deletes the Node and its
// ResourceSlices so the next test starts from a clean cluster. Stop pods
// first (DeleteNamespace): once the simulator is gone nobody unprepares.
func (n *Node) Stop(ctx context.Context) error {
	errs := []error{n.Plugin.Stop(), n.stopMPSDaemons()}
	if n.cancel != nil {
		n.cancel()
		errs = append(errs, <-n.simDone)
		n.cancel = nil
	}
	err := n.cp.Client.CoreV1().Nodes().Delete(ctx, n.Name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		errs = append(errs, fmt.Errorf("deleting node %s: %w", n.Name, err))
	}
	selector := fields.Set{resourceapi.ResourceSliceSelectorNodeName: n.Name}.AsSelector().String()
	err = n.cp.Client.ResourceV1().ResourceSlices().DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{FieldSelector: selector})
	if err != nil {
		errs = append(errs, fmt.Errorf("deleting ResourceSlices of %s: %w", n.Name, err))
	}
	return errors.Join(errs...)
}

// WaitForNodeSchedulable waits until the node is Ready and the
// node-lifecycle controller removed the not-ready taint admission put on
// it; before that the scheduler does not consider it.
func (cp *ControlPlane) WaitForNodeSchedulable(ctx context.Context, name string) error {
	err := wait.PollUntilContextCancel(ctx, pollInterval, true, func(ctx context.Context) (bool, error) {
		node, err := cp.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		// Without a controller-manager (APIServerOnly) nothing lifts the
		// not-ready taint, and no scheduler would read it.
		return nodeReady(node) && (len(node.Spec.Taints) == 0 || cp.apiServerOnly), nil
	})
	if err != nil {
		return fmt.Errorf("node %s not schedulable: %w", name, err)
	}
	return nil
}

func nodeReady(node *v1.Node) bool {
	for _, c := range node.Status.Conditions {
		if c.Type == v1.NodeReady {
			return c.Status == v1.ConditionTrue
		}
	}
	return false
}

// BuildPlugin compiles ./cmd/dra-kubelet-plugin of the repository into dir.
func BuildPlugin(ctx context.Context, dir string) (string, error) {
	return Build(ctx, dir, "cmd/dra-kubelet-plugin")
}

// stopMPSDaemons kills the stand-in MPS daemons that the plugin started
// and no unprepare stopped (a test that ends with claims prepared): they
// run in sessions of their own, outside the plugin's process.
func (n *Node) stopMPSDaemons() error {
	pidFiles, err := filepath.Glob(filepath.Join(n.PluginDataDir, "mps", "*", "pipe", "nvidia-cuda-mps-control.pid"))
	if err != nil {
		return err
	}
	for _, f := range pidFiles {
		data, err := os.ReadFile(f)
		if err != nil {
			continue // it quit meanwhile
		}
		if pid, err := strconv.Atoi(strings.TrimSpace(string(data))); err == nil && pid > 1 {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	return nil
}
