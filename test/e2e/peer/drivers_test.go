package peer

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/apimachinery/pkg/util/wait"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"

	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

// simulatedDriverVersion is the driver version the simulated dgxh100
// reports when its driver root holds no real NVIDIA userspace.
const simulatedDriverVersion = "550.54.15"

// nvidiaDriverName is the DRA driver name of NVIDIA's GPU plugin.
const nvidiaDriverName = "gpu.nvidia.com"

// driver is one plugin under measurement: its DRA driver name, its
// process and the kubelet gRPC client on its socket.
type driver struct {
	label   string // column heading
	name    string // DRA driver name
	version string
	proc    *framework.Process
	socket  string
	conn    *grpc.ClientConn
	client  drapb.DRAPluginClient
}

// dial connects to the plugin's DRA socket, waiting for it to appear.
func (d *driver) dial(ctx context.Context) error {
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) {
		_, err := os.Stat(d.socket)
		return err == nil, nil
	})
	if err != nil {
		return fmt.Errorf("%s: no DRA socket at %s (log %s): %w", d.label, d.socket, d.proc.LogPath, err)
	}
	conn, err := grpc.NewClient("unix://"+d.socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("%s: dialing %s: %w", d.label, d.socket, err)
	}
	d.conn, d.client = conn, drapb.NewDRAPluginClient(conn)
	return nil
}

func (d *driver) close() {
	if d.conn != nil {
		_ = d.conn.Close()
		d.conn, d.client = nil, nil
	}
}

// startNVIDIA runs NVIDIA's gpu-kubelet-plugin for node, unmodified, on
// the node's driver root: the simulated libnvidia-ml.so.1 in usr/lib64
// (the framework put it there for our --nvml real) and the stand-in
// nvidia-smi it wants in usr/bin. The environment is our plugin's, so the
// library serves both plugins one machine: the same state directory and
// the same GPU UUIDs. Its registration socket goes where the node's
// kubelet simulator watches, so both drivers are registered on one node.
// With dynamicMIG it runs with its DynamicMIG gate, in a mount namespace
// of its own that has the MIG capability files it reads (nvidiaMIGCaps).
func startNVIDIA(ctx context.Context, node *framework.Node, binary string, env []string, dynamicMIG bool) (*driver, error) {
	// Short: a Unix socket path must stay under 108 bytes.
	dir := filepath.Join(filepath.Dir(node.PluginDataDir), "nv")
	pluginsDir, cdiRoot := filepath.Join(dir, "p"), filepath.Join(dir, "cdi")
	for _, d := range []string{pluginsDir, cdiRoot} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			return nil, fmt.Errorf("creating %s: %w", d, err)
		}
	}
	driverRoot, err := nvidiaDriverRoot(dir, node)
	if err != nil {
		return nil, err
	}
	hook := filepath.Join(cp.BinDir, "nvidia-cdi-hook")
	if _, err := os.Stat(hook); err != nil {
		return nil, fmt.Errorf("NVIDIA's plugin needs nvidia-cdi-hook (make cdi-hook): %w", err)
	}
	proc := framework.NewProcess("nvidia-plugin-"+node.Name, binary,
		filepath.Join(cp.LogDir, "nvidia-plugin-"+node.Name+".log"),
		"--node-name", node.Name,
		"--kubeconfig", cp.Kubeconfig,
		"--cdi-root", cdiRoot,
		"--nvidia-driver-root", driverRoot,
		// Not in a container: the driver root is where it is on the host.
		"--container-driver-root", driverRoot,
		"--nvidia-cdi-hook-path", hook,
		"--kubelet-registrar-directory-path", node.RegistryDir,
		"--kubelet-plugins-directory-path", pluginsDir,
		"--healthcheck-port", "-1",
		// Required; names the image its CDI specs' hooks come from.
		"--image-name", "registry.k8s.io/dra-driver-nvidia-gpu:peer",
		"-v", "1",
	)
	proc.Env = env
	if dynamicMIG {
		if err := nvidiaMIGCaps(proc, dir); err != nil {
			return nil, err
		}
	}
	if err := proc.Start(); err != nil {
		return nil, err
	}
	d := &driver{
		label: "NVIDIA", name: nvidiaDriverName, version: os.Getenv(envVersion), proc: proc,
		socket: filepath.Join(pluginsDir, nvidiaDriverName, "dra.sock"),
	}
	if err := d.dial(ctx); err != nil {
		proc.Kill()
		return nil, err
	}
	return d, nil
}

// maxMIGInstanceID bounds the GPU instance IDs the capability files
// cover. Real NVML reuses a destroyed instance's ID; the simulated
// machine never does (go-nvml's mock counts up a GPU's IDs), so each
// prepare on gpu-7 gets a new one: 150 samples per plugin (50 at each of
// three levels), ours first, so NVIDIA's last is about ID 300. With 255,
// NVIDIA's 1,000-prepared samples ran out at gi256.
const maxMIGInstanceID = 511

// nvidiaMIGCaps gives NVIDIA's plugin what its CDI spec of a MIG device
// reads: each GPU and compute instance's capability file under
// /proc/driver/nvidia/capabilities (a path nothing moves), bind-mounted in
// a mount namespace of its own (unshare), and the nvidia-caps major in a
// /proc/devices of its own (ALT_PROC_DEVICES_PATH, its option for a
// simulated machine). The files are as the kernel module's nvidia-caps
// keeps them, for GPUs 0-7, instances 0-maxMIGInstanceID, compute
// instances 0-7.
func nvidiaMIGCaps(proc *framework.Process, dir string) error {
	procDriver := filepath.Join(dir, "proc-driver")
	minor := 0
	for gpu := range len(gpus) {
		for gi := range maxMIGInstanceID + 1 {
			base := filepath.Join(procDriver, "nvidia", "capabilities", fmt.Sprintf("gpu%d", gpu), "mig", fmt.Sprintf("gi%d", gi))
			paths := []string{base}
			for ci := range 8 {
				paths = append(paths, filepath.Join(base, fmt.Sprintf("ci%d", ci)))
			}
			for _, p := range paths {
				if err := os.MkdirAll(p, 0o755); err != nil {
					return fmt.Errorf("MIG capability files for NVIDIA's plugin: %w", err)
				}
				access := fmt.Sprintf("DeviceFileMinor: %d\nDeviceFileMode: 292\nDeviceFileModify: 1\n", minor)
				if err := os.WriteFile(filepath.Join(p, "access"), []byte(access), 0o444); err != nil {
					return fmt.Errorf("MIG capability files for NVIDIA's plugin: %w", err)
				}
				minor++
			}
		}
	}
	devices := filepath.Join(dir, "proc-devices")
	if err := os.WriteFile(devices, []byte("Character devices:\n195 nvidia-frontend\n508 nvidia-caps\n\nBlock devices:\n"), 0o644); err != nil {
		return fmt.Errorf("a /proc/devices for NVIDIA's plugin: %w", err)
	}
	proc.Args = append([]string{"-m", "--propagation", "private", "sh", "-c", `mount --bind "$0" /proc/driver && exec "$@"`,
		procDriver, proc.Path, "--feature-gates=DynamicMIG=true"}, proc.Args...)
	proc.Path = "unshare"
	proc.Env = append(proc.Env, "ALT_PROC_DEVICES_PATH="+devices)
	return nil
}

// nvidiaDriverRoot makes NVIDIA's plugin a driver root of its own beside
// the node's: the same simulated library and stand-in nvidia-smi, plus a
// stand-in libcuda.so.<the driver version NVML reports> and device nodes,
// without which its CDI specs refuse every claim (no container runs here, so an empty file
// suffices). Ours keeps a root without libcuda: given one, it wants
// nvidia-cdi-hook as well, and the runs before issue 37 measured it so.
func nvidiaDriverRoot(dir string, node *framework.Node) (string, error) {
	root := filepath.Join(dir, "driver")
	// Device nodes (mknod, under the root only): its CDI spec of a GPU is
	// its device node, and an empty spec is refused.
	if err := framework.MakeDriverRoot(root, 8); err != nil {
		return "", err
	}
	lib, bin := filepath.Join(root, "usr", "lib64"), filepath.Join(root, "usr", "bin")
	for _, d := range []string{lib, bin} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return "", fmt.Errorf("creating %s: %w", d, err)
		}
	}
	links := map[string]string{
		filepath.Join(lib, "libnvidia-ml.so.1"): nvmlLibrary,
		filepath.Join(bin, "nvidia-smi"):        filepath.Join(node.DriverRoot, "usr", "bin", "nvidia-smi"),
	}
	for link, target := range links {
		if err := os.Symlink(target, link); err != nil {
			return "", fmt.Errorf("NVIDIA's driver root: %w", err)
		}
	}
	if err := os.WriteFile(filepath.Join(lib, "libcuda.so."+simulatedDriverVersion), nil, 0o644); err != nil {
		return "", fmt.Errorf("a stand-in libcuda for NVIDIA's plugin: %w", err)
	}
	return root, nil
}

// ours wraps the node's own plugin.
func ours(ctx context.Context, node *framework.Node, version string) (*driver, error) {
	d := &driver{
		label: "gpuaas", name: framework.DriverName, version: version, proc: node.Plugin,
		socket: filepath.Join(node.PluginDataDir, "dra.sock"),
	}
	return d, d.dial(ctx)
}
