package framework

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/util/wait"
)

// What the rest of a node does to the plugin (issue 39): the kubelet and
// containerd stopped and started again with the same directories, as a
// node upgrade or a restart of their services does, and a small
// filesystem under a directory of the node that a test can fill.

// StopKubelet stops the node's kubelet as a restart of its service does:
// the containers it started keep running under their shims.
func (n *RealNode) StopKubelet() error {
	return n.Kubelet.Stop()
}

// StartKubelet starts the stopped kubelet again with the same flags,
// configuration and directories, and waits until it is healthy and the
// node schedulable.
func (n *RealNode) StartKubelet(ctx context.Context) error {
	if err := n.Kubelet.Start(); err != nil {
		return err
	}
	if err := waitHealthy(ctx, n.Kubelet, n.kubeletHealthz, ""); err != nil {
		return err
	}
	return n.cp.WaitForNodeSchedulable(ctx, n.Name)
}

// StopContainerd stops containerd as a restart of its service does: the
// shims (their own process groups) keep the containers running.
func (n *RealNode) StopContainerd() error {
	return n.Containerd.Stop()
}

// StartContainerd starts the stopped containerd again with the same
// configuration and waits until it answers on its socket.
func (n *RealNode) StartContainerd(ctx context.Context) error {
	if err := n.Containerd.Start(); err != nil {
		return err
	}
	return n.waitContainerd(ctx)
}

// MountTmpfs mounts a tmpfs of size bytes on dir (created if missing): a
// small filesystem that a test can fill. A container that mounts a
// directory above dir sees it only if it was mounted before the container
// started. RealNode.Stop unmounts it with everything under the node's Dir.
func MountTmpfs(dir string, size int64) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", dir, err)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, fmt.Sprintf("size=%d,mode=0755", size)); err != nil {
		return fmt.Errorf("mounting a tmpfs of %d bytes on %s: %w", size, dir, err)
	}
	return nil
}

// FillFilesystem writes the file path until its filesystem has no space
// left, and returns how many bytes the file holds. Removing the file frees
// the space again.
func FillFilesystem(path string) (int64, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return 0, fmt.Errorf("creating %s: %w", path, err)
	}
	defer func() { _ = f.Close() }()
	var written int64
	for _, size := range []int{64 << 10, 4 << 10, 1} {
		chunk := make([]byte, size)
		for {
			n, err := f.Write(chunk)
			written += int64(n)
			if errors.Is(err, syscall.ENOSPC) {
				break
			}
			if err != nil {
				return written, fmt.Errorf("filling %s: %w", path, err)
			}
		}
	}
	return written, nil
}

// apiServerProcess is the control plane's kube-apiserver.
func (cp *ControlPlane) apiServerProcess() (*Process, error) {
	for _, p := range cp.procs {
		if p.Name == "kube-apiserver" {
			return p, nil
		}
	}
	return nil, errors.New("the control plane runs no kube-apiserver")
}

// StopAPIServer stops the kube-apiserver, as a control-plane upgrade or
// etcd trouble makes it unreachable: every client's requests and watches
// fail until StartAPIServer. etcd keeps the cluster's state.
func (cp *ControlPlane) StopAPIServer() error {
	p, err := cp.apiServerProcess()
	if err != nil {
		return err
	}
	return p.Stop()
}

// StartAPIServer starts the stopped kube-apiserver again with the same
// flags (address, certificates, tokens) and waits until it is ready.
func (cp *ControlPlane) StartAPIServer(ctx context.Context) error {
	p, err := cp.apiServerProcess()
	if err != nil {
		return err
	}
	if err := p.Start(); err != nil {
		return err
	}
	var last error
	err = wait.PollUntilContextCancel(ctx, pollInterval, true, func(ctx context.Context) (bool, error) {
		if exited, err := p.Exited(); exited {
			return false, fmt.Errorf("kube-apiserver exited (%w):\n%s", err, p.Tail(30))
		}
		_, last = cp.Client.CoreV1().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return last == nil, nil
	})
	if err != nil {
		return fmt.Errorf("kube-apiserver not ready after its restart (last answer: %w): %w", last, err)
	}
	return nil
}

// PowerOff does to the node what a power loss does, short of the GPUs
// (the test resets the simulated ones, nvmock.Reboot): the kubelet, every
// container and containerd with its shims end at once, what lives in
// memory goes (the mounts of containers and pod volumes), and what a
// reboot finds empty is emptied: the CDI spec directory and containerd's
// state (both under /run on a GPU node) and the sockets of the kubelet's
// plugins. What is on disk stays: the kubelet's root directory with its
// checkpoints, the plugin's records, containerd's root. Start it again
// with PowerOn.
func (n *RealNode) PowerOff() error {
	n.Kubelet.Kill()
	errs := []error{killCgroup(n.CgroupRoot)}
	n.Containerd.Kill()
	errs = append(errs, killShims(n.ContainerdSocket),
		unmountUnder(filepath.Join(n.Dir, "ctd")), unmountUnder(filepath.Join(n.KubeletDir, "pods")))
	for _, dir := range []string{n.CDIRoot, filepath.Join(n.Dir, "ctd", "state")} {
		errs = append(errs, emptyDir(dir))
	}
	for _, pattern := range []string{"plugins_registry/*.sock", "plugins/*/*.sock", "pod-resources/*.sock"} {
		socks, _ := filepath.Glob(filepath.Join(n.KubeletDir, pattern))
		for _, s := range socks {
			errs = append(errs, os.Remove(s))
		}
	}
	return errors.Join(errs...)
}

// PowerOn starts containerd and the kubelet of a node that PowerOff ended,
// with the same configuration and directories, as the node's boot does.
func (n *RealNode) PowerOn(ctx context.Context) error {
	if err := n.StartContainerd(ctx); err != nil {
		return err
	}
	return n.StartKubelet(ctx)
}

// emptyDir removes what dir holds and keeps dir.
func emptyDir(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("emptying %s: %w", dir, err)
	}
	var errs []error
	for _, e := range entries {
		errs = append(errs, os.RemoveAll(filepath.Join(dir, e.Name())))
	}
	return errors.Join(errs...)
}
