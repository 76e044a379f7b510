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
// extraArgs are added to its command line (its feature gates).
func startNVIDIA(ctx context.Context, node *framework.Node, binary string, env []string, extraArgs ...string) (*driver, error) {
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
	proc.Args = append(proc.Args, extraArgs...)
	proc.Env = env
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
