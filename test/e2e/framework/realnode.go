package framework

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

// realNodeStartTimeout bounds starting containerd and the kubelet and the
// node becoming schedulable; on a loaded 2-core machine the kubelet takes
// up to a minute.
const realNodeStartTimeout = 3 * time.Minute

// GPUPresentLabel selects the nodes the chart's plugin DaemonSet runs on.
const GPUPresentLabel = "nvidia.com/gpu.present"

// RealNodeBinaries are what a real node needs in the control plane's bin
// dir besides it (make k8s-bins node-bins).
var RealNodeBinaries = []string{"kubelet", "containerd", "containerd-shim-runc-v2", "ctr", "runc"}

// RealNodeOptions describe a real node.
type RealNodeOptions struct {
	Name string
	// GPUs is the number of device nodes of the simulated driver root; 8
	// matches the mock NVML machines.
	GPUs int
	// Images are OCI tarballs imported into containerd before the kubelet
	// starts (the sandbox image among them).
	Images []string
	// Labels are the Node's labels; GPUPresentLabel is always set.
	Labels map[string]string
	// Verbosity is the kubelet's -v; default 2.
	Verbosity int
	// OwnDevicePluginDir gives the kubelet a device-plugin directory of the
	// node's own (RealNode.DevicePluginDir), for tests that register a
	// device plugin. The kubelet's is /var/lib/kubelet/device-plugins
	// whatever its --root-dir, so every real kubelet on the machine would
	// share it (and a device plugin might register with another test's
	// kubelet): the kubelet runs in a mount namespace of its own where
	// the node's directory is bind-mounted there (mountns.go).
	OwnDevicePluginDir bool
	// NVMLLibrary, when set, is the simulated libnvidia-ml.so.1
	// (hack/nvmlshim): it goes into the driver root at usr/lib64, the
	// first place --nvml real looks, beside NVIDIA's real userspace, and
	// the chart's plugin runs --nvml real on it (ChartValues) instead of
	// the in-process mock. Containers still get NVIDIA's real libraries:
	// nvcdi finds them by the driver version the library reports.
	NVMLLibrary string
	// PlainHTTPRegistries are registries ("127.0.0.1:5000") containerd
	// pulls from over plain HTTP, such as the release tests' local one.
	PlainHTTPRegistries []string
}

// RealNode is a node of real components on this machine: containerd (with
// runc and the CRI's CDI support) and the kubelet, as child processes, with
// their directories under Dir. The GPUs are simulated: the plugin runs with
// a mock NVML, and DriverRoot holds the device nodes a driver would create.
type RealNode struct {
	Name string
	Dir  string
	// KubeletDir is the kubelet's --root-dir (the chart's kubeletDir).
	KubeletDir string
	// CDIRoot is where containerd reads CDI specs (the chart's cdiRoot).
	CDIRoot string
	// DriverRoot is the simulated driver root (the chart's driverRoot),
	// with stand-ins for nvidia-smi and nvidia-cuda-mps-control.
	DriverRoot string
	// ToolCalls is the stand-in tools' call log (ReadToolCalls), in the
	// plugin's directory, which its container can write.
	ToolCalls string
	// PodLogsDir holds the containers' logs.
	PodLogsDir       string
	ContainerdSocket string
	// CgroupRoot is the kubelet's cgroup root: every container of the node
	// runs below it.
	CgroupRoot string
	// DevicePluginDir is where the kubelet serves device-plugin
	// registration (kubelet.sock) and looks for device plugins' sockets,
	// as this machine sees it: set with RealNodeOptions.OwnDevicePluginDir.
	DevicePluginDir string

	Containerd *Process
	Kubelet    *Process

	// SimulatedNVML: the plugin runs --nvml real on the simulated library
	// (RealNodeOptions.NVMLLibrary), which every driver root of the node
	// holds.
	SimulatedNVML bool
	nvmlLibrary   string
	// kubeletHealthz is the kubelet's health endpoint (StartKubelet).
	kubeletHealthz string

	cp *ControlPlane
}

// MissingRealNodeBinaries lists the real-node binaries absent from dir.
func MissingRealNodeBinaries(dir string) []string {
	var missing []string
	for _, b := range RealNodeBinaries {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			missing = append(missing, b)
		}
	}
	if _, err := os.Stat(filepath.Join(CNIBinDir, "loopback")); err != nil {
		missing = append(missing, CNIBinDir+"/loopback")
	}
	return missing
}

// RealNodeUnavailable says why this machine cannot run a real node with the
// binaries of binDir, or "" when it can.
func RealNodeUnavailable(binDir string) string {
	if os.Geteuid() != 0 {
		return "not root: containerd, runc, the kubelet and mknod need root"
	}
	if missing := MissingRealNodeBinaries(binDir); len(missing) > 0 {
		return fmt.Sprintf("real-node binaries %v not built (make k8s-bins node-bins)", missing)
	}
	return ""
}

// StartRealNode starts containerd, imports the images, starts the kubelet
// and waits until the node is schedulable. On error everything started is
// stopped again.
func (cp *ControlPlane) StartRealNode(ctx context.Context, opts RealNodeOptions) (*RealNode, error) {
	if why := RealNodeUnavailable(cp.BinDir); why != "" {
		return nil, errors.New(why)
	}
	ctx, cancel := context.WithTimeout(ctx, realNodeStartTimeout)
	defer cancel()
	n, err := cp.newRealNode(opts)
	if err != nil {
		return nil, err
	}
	begin := time.Now()
	if err := n.start(ctx, opts); err != nil {
		return nil, errors.Join(err, n.Stop(context.WithoutCancel(ctx)))
	}
	cp.logf("real node %s ready in %.1fs (containerd + kubelet, dir %s)", n.Name, time.Since(begin).Seconds(), n.Dir)
	return n, nil
}

func (n *RealNode) start(ctx context.Context, opts RealNodeOptions) error {
	if err := n.fillDriverRoot(ctx, n.DriverRoot); err != nil {
		return err
	}
	if opts.NVMLLibrary != "" {
		if err := installSimulatedNVML(ctx, opts.NVMLLibrary, n.DriverRoot); err != nil {
			return err
		}
		n.SimulatedNVML, n.nvmlLibrary = true, opts.NVMLLibrary
	}
	if err := n.startContainerd(ctx, opts.PlainHTTPRegistries); err != nil {
		return err
	}
	for _, img := range opts.Images {
		if err := n.ImportImage(ctx, img); err != nil {
			return err
		}
	}
	if err := n.startKubelet(ctx, opts); err != nil {
		return err
	}
	if err := n.cp.WaitForNodeSchedulable(ctx, n.Name); err != nil {
		return fmt.Errorf("%w; kubelet log %s:\n%s", err, n.Kubelet.LogPath, n.Kubelet.Tail(20))
	}
	return nil
}

// OperatorDriverRoot makes a second driver root the way the GPU
// Operator's driver container provides one, at run/nvidia/driver under the
// node's directory (on a GPU node: /run/nvidia/driver): the same userspace
// and device nodes, the stand-in nvidia-smi. It returns the root.
func (n *RealNode) OperatorDriverRoot(ctx context.Context, gpus int) (string, error) {
	root, err := n.NVIDIADriverRoot(ctx, filepath.Join("run", "nvidia", "driver"), gpus)
	if err != nil || !n.SimulatedNVML {
		return root, err
	}
	return root, installSimulatedNVML(ctx, n.nvmlLibrary, root)
}

// NVIDIADriverRoot makes a driver root at dir (relative to the node's
// directory) with NVIDIA's real userspace and device nodes only, never the
// simulated NVML library, whatever the node's plugin runs on: the root of
// a node whose kernel module is missing. It returns the root.
func (n *RealNode) NVIDIADriverRoot(ctx context.Context, dir string, gpus int) (string, error) {
	root := filepath.Join(n.Dir, dir)
	if err := MakeDriverRoot(root, gpus); err != nil {
		return "", err
	}
	return root, n.fillDriverRoot(ctx, root)
}

// installSimulatedNVML copies the simulated NVML library into a driver
// root at usr/lib64/libnvidia-ml.so.1. Copied, not linked: the root is
// mounted into the plugin's container, where a link out of it would
// dangle.
func installSimulatedNVML(ctx context.Context, lib, root string) error {
	dir := filepath.Join(root, "usr", "lib64")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if out, err := exec.CommandContext(ctx, "cp", lib, filepath.Join(dir, "libnvidia-ml.so.1")).CombinedOutput(); err != nil {
		return fmt.Errorf("installing the simulated NVML library: %w: %s", err, out)
	}
	return nil
}

// fillDriverRoot puts NVIDIA's real driver userspace into a driver root,
// with a stand-in only for the nvidia-smi call that needs a GPU to succeed
// (setting an interval); the real MPS control daemon runs without one.
func (n *RealNode) fillDriverRoot(ctx context.Context, root string) error {
	if err := InstallDriverUserspace(ctx, root); err != nil {
		return err
	}
	return InstallFakeNVTools(ctx, root, n.ToolCalls, "nvidia-smi")
}

func (cp *ControlPlane) newRealNode(opts RealNodeOptions) (*RealNode, error) {
	if opts.GPUs == 0 {
		opts.GPUs = 8
	}
	// Numbered, short directories: the sockets below must stay under 108 bytes.
	dir := filepath.Join(cp.Dir, "rn", fmt.Sprint(cp.nodeCount.Add(1)))
	n := &RealNode{
		Name:             opts.Name,
		Dir:              dir,
		KubeletDir:       filepath.Join(dir, "kubelet"),
		CDIRoot:          filepath.Join(dir, "cdi"),
		DriverRoot:       filepath.Join(dir, "driver"),
		ToolCalls:        filepath.Join(dir, "kubelet", "plugins", DriverName, "fake-nvtools-calls.jsonl"),
		PodLogsDir:       filepath.Join(dir, "pod-logs"),
		ContainerdSocket: filepath.Join(dir, "containerd.sock"),
		CgroupRoot:       "/" + filepath.Base(cp.Dir) + "-node" + filepath.Base(dir),
		cp:               cp,
	}
	for _, d := range []string{n.KubeletDir, n.CDIRoot, n.PodLogsDir, filepath.Join(n.KubeletDir, "plugins_registry")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("creating %s: %w", d, err)
		}
	}
	if err := MakeDriverRoot(n.DriverRoot, opts.GPUs); err != nil {
		return nil, err
	}
	if err := makeSharedMount(dir); err != nil {
		return nil, err
	}
	if err := makeCgroup(n.CgroupRoot); err != nil {
		return nil, err
	}
	return n, nil
}

func (n *RealNode) startKubelet(ctx context.Context, opts RealNodeOptions) error {
	ports, err := FreePorts(2)
	if err != nil {
		return err
	}
	cfg, err := n.writeKubeletConfig(ports[0], ports[1])
	if err != nil {
		return err
	}
	labels := map[string]string{GPUPresentLabel: "true"}
	for k, v := range opts.Labels {
		labels[k] = v
	}
	verbosity := opts.Verbosity
	if verbosity == 0 {
		verbosity = 2
	}
	kubelet := n.cp.kubernetesBinary("kubelet")
	if _, err := os.Stat(kubelet); err != nil {
		return fmt.Errorf("the kubelet of the control plane's version (hack/build-k8s-version.sh vX.Y kubelet): %w", err)
	}
	n.Kubelet = NewProcess("kubelet-"+n.Name, kubelet, filepath.Join(n.cp.LogDir, "kubelet-"+n.Name+".log"),
		n.cp.withGates("kubelet", n.kubeletArgs(cfg, labels, verbosity))...)
	if opts.OwnDevicePluginDir {
		n.DevicePluginDir = filepath.Join(n.Dir, "device-plugins")
		if err := withOwnDevicePluginDir(n.Kubelet, n.DevicePluginDir); err != nil {
			return err
		}
	}
	if err := n.Kubelet.Start(); err != nil {
		return err
	}
	n.kubeletHealthz = fmt.Sprintf("http://127.0.0.1:%d/healthz", ports[1])
	return waitHealthy(ctx, n.Kubelet, n.kubeletHealthz, "")
}

// Stop ends the node: the kubelet first (so nothing restarts containers),
// then every process below the node's cgroup root (the containers), then
// containerd and its shims; it unmounts what the kubelet and containerd
// mounted under Dir and deletes the Node object and its ResourceSlices.
// Delete pods first when their claims should be unprepared.
func (n *RealNode) Stop(ctx context.Context) error {
	var errs []error
	if n.Kubelet != nil {
		errs = append(errs, n.Kubelet.Stop())
	}
	errs = append(errs, killCgroup(n.CgroupRoot))
	if n.Containerd != nil {
		errs = append(errs, n.Containerd.Stop())
	}
	errs = append(errs, killShims(n.ContainerdSocket), unmountUnder(n.Dir), removeCgroup(n.CgroupRoot))
	err := n.cp.Client.CoreV1().Nodes().Delete(ctx, n.Name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		errs = append(errs, fmt.Errorf("deleting node %s: %w", n.Name, err))
	}
	return errors.Join(errs...)
}

// WaitForPodLog waits until the container's log contains want and returns
// the whole log.
func (n *RealNode) WaitForPodLog(ctx context.Context, namespace, pod, container, want string) (string, error) {
	return n.waitForPodLog(ctx, namespace, pod, container, want, containsLine)
}

// WaitForPodLogContaining is WaitForPodLog for a line that contains want
// (a program's own log lines carry a timestamp).
func (n *RealNode) WaitForPodLogContaining(ctx context.Context, namespace, pod, container, want string) (string, error) {
	return n.waitForPodLog(ctx, namespace, pod, container, want, strings.Contains)
}

func (n *RealNode) waitForPodLog(ctx context.Context, namespace, pod, container, want string, has func(log, want string) bool) (string, error) {
	var log string
	err := wait.PollUntilContextCancel(ctx, pollInterval, true, func(ctx context.Context) (bool, error) {
		p, err := n.cp.Client.CoreV1().Pods(namespace).Get(ctx, pod, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		log, err = ReadContainerLog(n.PodLogsDir, p, container)
		return err == nil && has(log, want), nil
	})
	if err != nil {
		return log, fmt.Errorf("log of %s/%s container %s has no line with %q (so far:\n%s): %w", namespace, pod, container, want, log, err)
	}
	return log, nil
}
