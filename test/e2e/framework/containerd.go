package framework

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// SandboxImage is the pod sandbox ("pause") image of the real node, built
// from test/images/pause and pinned in containerd so it is never pulled.
const SandboxImage = "localhost/gpuaas/pause:e2e"

// containerdConfig is containerd's configuration (version 3) for a real
// node: everything under the node's directory, CDI on with the plugin's CDI
// root, runc with cgroupfs, a loopback-only CNI network (pods run on the
// host network; see shared/notes/real-node.md).
const containerdConfig = `version = 3
root = %[1]q
state = %[2]q
[grpc]
  address = %[3]q
[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = %[4]q
[plugins."io.containerd.cri.v1.runtime"]
  enable_cdi = true
  cdi_spec_dirs = [%[5]q]
  # runc cannot lower oom_score_adj on machines without CAP_SYS_RESOURCE.
  restrict_oom_score_adj = true
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = %[6]q
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = [%[7]q]
    conf_dir = %[8]q
`

// loopbackCNI lets the runtime report its network ready without routing
// anything on the machine.
const loopbackCNI = `{"cniVersion":"1.0.0","name":"gpuaas-loopback","plugins":[{"type":"loopback"}]}`

// CNIBinDir holds the CNI plugins (Debian's containernetworking-plugins).
const CNIBinDir = "/usr/lib/cni"

// startContainerd writes the configuration and starts containerd, waiting
// for its socket to answer.
func (n *RealNode) startContainerd(ctx context.Context, plainHTTP []string) error {
	cniDir := filepath.Join(n.Dir, "cni")
	if err := os.MkdirAll(cniDir, 0o755); err != nil {
		return fmt.Errorf("creating CNI dir: %w", err)
	}
	if err := os.WriteFile(filepath.Join(cniDir, "10-loopback.conflist"), []byte(loopbackCNI), 0o644); err != nil {
		return fmt.Errorf("writing CNI config: %w", err)
	}
	cfg := fmt.Sprintf(containerdConfig, filepath.Join(n.Dir, "ctd", "root"), filepath.Join(n.Dir, "ctd", "state"),
		n.ContainerdSocket, SandboxImage, n.CDIRoot, filepath.Join(n.cp.BinDir, "runc"), CNIBinDir, cniDir)
	if len(plainHTTP) > 0 {
		hostsDir, err := writeRegistryHosts(filepath.Join(n.Dir, "ctd", "certs.d"), plainHTTP)
		if err != nil {
			return err
		}
		cfg += fmt.Sprintf("[plugins.\"io.containerd.cri.v1.images\".registry]\n  config_path = %q\n", hostsDir)
	}
	cfgPath := filepath.Join(n.Dir, "containerd.toml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		return fmt.Errorf("writing containerd config: %w", err)
	}
	n.Containerd = NewProcess("containerd-"+n.Name, filepath.Join(n.cp.BinDir, "containerd"),
		filepath.Join(n.cp.LogDir, "containerd-"+n.Name+".log"), "--config", cfgPath)
	// The shim and runc are found on PATH.
	n.Containerd.Env = []string{"PATH=" + n.cp.BinDir + ":" + os.Getenv("PATH")}
	if err := n.Containerd.Start(); err != nil {
		return err
	}
	return n.waitContainerd(ctx)
}

// waitContainerd waits until containerd answers on its socket.
func (n *RealNode) waitContainerd(ctx context.Context) error {
	err := wait.PollUntilContextCancel(ctx, pollInterval, true, func(context.Context) (bool, error) {
		if exited, err := n.Containerd.Exited(); exited {
			return false, fmt.Errorf("containerd exited (%w):\n%s", err, n.Containerd.Tail(30))
		}
		conn, err := net.DialTimeout("unix", n.ContainerdSocket, time.Second)
		if err != nil {
			return false, nil
		}
		_ = conn.Close()
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("containerd of %s not answering on %s: %w", n.Name, n.ContainerdSocket, err)
	}
	return nil
}

// ImportImage imports an OCI image tarball into the CRI's namespace.
func (n *RealNode) ImportImage(ctx context.Context, tarball string) error {
	cmd := exec.CommandContext(ctx, filepath.Join(n.cp.BinDir, "ctr"), "--address", n.ContainerdSocket,
		"--namespace", "k8s.io", "images", "import", tarball)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("ctr images import %s: %w\n%s", tarball, err, out)
	}
	return nil
}

// writeRegistryHosts writes containerd's registry host configuration
// (config_path/<host>/hosts.toml) for registries served over plain HTTP,
// and returns config_path.
func writeRegistryHosts(dir string, registries []string) (string, error) {
	for _, r := range registries {
		host := filepath.Join(dir, r)
		if err := os.MkdirAll(host, 0o755); err != nil {
			return "", fmt.Errorf("registry hosts: %w", err)
		}
		toml := fmt.Sprintf("server = %[1]q\n\n[host.%[1]q]\n  capabilities = [\"pull\", \"resolve\"]\n", "http://"+r)
		if err := os.WriteFile(filepath.Join(host, "hosts.toml"), []byte(toml), 0o644); err != nil {
			return "", fmt.Errorf("registry hosts: %w", err)
		}
	}
	return dir, nil
}
