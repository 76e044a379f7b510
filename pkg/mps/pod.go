package mps

import (
	"cmp"
	"context"
	"fmt"
	"path"
	"path/filepath"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
)

// Labels of the daemon pods: a Launcher finds a GPU's pod by them, and the
// chart's admission policy lets the plugin touch no other pod.
const (
	ComponentLabel = "app.kubernetes.io/component"
	ComponentValue = "mps-control-daemon"
	NodeLabel      = "gpu.gpuaas.io/node"
	GPULabel       = "gpu.gpuaas.io/gpu"
)

// PodLauncher runs each daemon in a pod of its own, bound to this node: it
// outlives the plugin's container and pod (restarts, rolling updates), and
// the kubelet restarts a daemon that crashed. The pods belong to the
// plugin's DaemonSet (Owner), so uninstalling the driver removes them.
type PodLauncher struct {
	Client    kubernetes.Interface
	Namespace string
	NodeName  string
	// Image runs the daemon; the plugin's own image (the binary comes from
	// the driver root, which the pod mounts).
	Image string
	// DriverRoot is where this process (and the daemon pod) sees the
	// driver root; HostDriverRoot where it is on the host.
	DriverRoot, HostDriverRoot string
	// Owner is set on every daemon pod; nil leaves them unowned.
	Owner *metav1.OwnerReference
	// PriorityClassName of the daemon pods, the plugin's own: a daemon
	// evicted under pressure stops every client on its GPU.
	PriorityClassName string
	// Exec is the plugin binary in Image, which runs the daemon inside the
	// driver root (ExecInRootCommand); empty means DefaultExec.
	Exec string
}

// DefaultExec is where the release image has the plugin binary.
const DefaultExec = "/usr/bin/dra-kubelet-plugin"

// In the driver root of a daemon pod, the GPU's directory is mounted at
// rootGPUDir and its shared memory at /dev/shm: both exist in every root
// (a host's, the GPU Operator's driver container), so the read-only
// driver root needs no new mount point.
const (
	rootGPUDir = "/tmp"
	// rootPath is a usual PATH inside the driver root, where the control
	// daemon looks for nvidia-cuda-mps-server.
	rootPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
)

// Launch implements Launcher: a live pod of the GPU is kept; finished ones
// (the daemon quit, or the pod failed) are deleted and a new one created.
func (l *PodLauncher) Launch(ctx context.Context, d Daemon) error {
	if l.Image == "" || l.Namespace == "" || l.NodeName == "" {
		return fmt.Errorf("MPS daemon pods need the plugin's image, namespace and node (image %q, namespace %q, node %q)",
			l.Image, l.Namespace, l.NodeName)
	}
	pod, err := l.Pod(d)
	if err != nil {
		return err
	}
	pods, err := l.pods(ctx, d.GPU)
	if err != nil {
		return err
	}
	for _, p := range pods {
		if live(&p) {
			return nil
		}
		if err := l.delete(ctx, p.Name); err != nil {
			return err
		}
	}
	created, err := l.Client.CoreV1().Pods(l.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("creating the MPS daemon pod of %s: %w", d.GPU, err)
	}
	klog.FromContext(ctx).Info("Started MPS control daemon", "gpu", d.GPU, "pod", klog.KObj(created))
	return nil
}

// Remove implements Launcher.
func (l *PodLauncher) Remove(ctx context.Context, gpu string) error {
	pods, err := l.pods(ctx, gpu)
	if err != nil {
		return err
	}
	for _, p := range pods {
		if err := l.delete(ctx, p.Name); err != nil {
			return err
		}
	}
	return nil
}

func live(p *corev1.Pod) bool {
	return p.DeletionTimestamp == nil && p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed
}

func (l *PodLauncher) pods(ctx context.Context, gpu string) ([]corev1.Pod, error) {
	sel := labels.SelectorFromSet(l.labels(gpu)).String()
	list, err := l.Client.CoreV1().Pods(l.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		return nil, fmt.Errorf("listing MPS daemon pods of %s: %w", gpu, err)
	}
	return list.Items, nil
}

func (l *PodLauncher) delete(ctx context.Context, name string) error {
	err := l.Client.CoreV1().Pods(l.Namespace).Delete(ctx, name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting MPS daemon pod %s: %w", name, err)
	}
	return nil
}

func (l *PodLauncher) labels(gpu string) map[string]string {
	return map[string]string{ComponentLabel: ComponentValue, NodeLabel: l.NodeName, GPULabel: strings.ToLower(gpu)}
}

// Pod is the daemon's pod, as Launch creates it: the control binary in
// the foreground (-f, so the kubelet sees it exit) inside the driver root,
// the GPU's directory (pipe, log) and its shm mounted into that root. It
// runs in the host's PID namespace: the driver root's /proc (a host
// install's) is the host's, where an MPS server looks itself up. It exits
// 0 on quit and is not restarted then; a crash is. The chart's admission
// policy lets the plugin's account create this pod and nothing more
// (kubeletplugin-policy.yaml): a change here needs one there, and
// test/e2e/mpspolicy_test.go fails until both agree.
func (l *PodLauncher) Pod(d Daemon) (*corev1.Pod, error) {
	bin, err := l.inRoot(d.Command.Path)
	if err != nil {
		return nil, err
	}
	exec := cmp.Or(l.Exec, DefaultExec)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName: "mps-" + l.NodeName + "-",
			Namespace:    l.Namespace,
			Labels:       l.labels(d.GPU),
			Annotations:  map[string]string{"gpu.gpuaas.io/gpu-uuid": d.GPU},
		},
		Spec: corev1.PodSpec{
			NodeName:      l.NodeName,
			RestartPolicy: corev1.RestartPolicyOnFailure,
			// It talks over Unix sockets only: on the host network it
			// needs no pod IP and does not wait for the CNI, which GPU
			// nodes' clients must not wait on either.
			HostNetwork:       true,
			HostPID:           true,
			PriorityClassName: l.PriorityClassName,
			Tolerations:       []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			// No API identity: the daemon never calls the API server.
			// The namespace's default account is what the API server
			// would set; naming it keeps the spec the admission policy
			// sees the one built here.
			ServiceAccountName:            "default",
			AutomountServiceAccountToken:  ptr.To(false),
			TerminationGracePeriodSeconds: ptr.To[int64](10),
			Containers: []corev1.Container{{
				Name:    "mps-control-daemon",
				Image:   l.Image,
				Command: []string{exec, ExecInRootCommand, PodDriverRoot, bin, "-f"},
				Env:     daemonEnv(d.GPU),
				// The daemon opens the GPUs' device nodes, as the plugin
				// does, and chroot needs CAP_SYS_CHROOT.
				SecurityContext: &corev1.SecurityContext{Privileged: ptr.To(true), RunAsUser: ptr.To[int64](0)},
				VolumeMounts: []corev1.VolumeMount{
					{Name: "driver-root", MountPath: PodDriverRoot, ReadOnly: true},
					{Name: "mps", MountPath: path.Join(PodDriverRoot, rootGPUDir)},
					{Name: "shm", MountPath: path.Join(PodDriverRoot, ShmContainerPath)},
				},
			}},
			Volumes: []corev1.Volume{
				hostPathVolume("driver-root", cmp.Or(l.HostDriverRoot, l.DriverRoot), corev1.HostPathDirectory),
				hostPathVolume("mps", d.Dir, corev1.HostPathDirectory),
				hostPathVolume("shm", d.ShmDir, corev1.HostPathDirectory),
			},
		},
	}
	if l.Owner != nil {
		pod.OwnerReferences = []metav1.OwnerReference{*l.Owner}
	}
	return pod, nil
}

// inRoot is the control binary's path inside the driver root.
func (l *PodLauncher) inRoot(bin string) (string, error) {
	rel, err := filepath.Rel(l.DriverRoot, bin)
	if err != nil || l.DriverRoot == "" || strings.HasPrefix(rel, "..") {
		return "", fmt.Errorf("MPS control binary %s is not under the driver root %q", bin, l.DriverRoot)
	}
	return path.Join("/", filepath.ToSlash(rel)), nil
}

// daemonEnv is the daemon's environment inside the driver root: its GPU,
// the pipe and log directories below the mounted GPU directory, a PATH.
func daemonEnv(gpu string) []corev1.EnvVar {
	return []corev1.EnvVar{
		{Name: "CUDA_VISIBLE_DEVICES", Value: gpu},
		{Name: EnvPipeDir, Value: path.Join(rootGPUDir, pipeSubdir)},
		{Name: EnvLogDir, Value: path.Join(rootGPUDir, logSubdir)},
		{Name: "PATH", Value: rootPath},
	}
}

func hostPathVolume(name, path string, t corev1.HostPathType) corev1.Volume {
	return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{
		HostPath: &corev1.HostPathVolumeSource{Path: filepath.Clean(path), Type: &t}}}
}

// OwnerOf is the controller of the plugin's own pod (its DaemonSet), as
// the owner of the daemon pods; nil when the pod has none.
func OwnerOf(ctx context.Context, client kubernetes.Interface, namespace, podName string) (*metav1.OwnerReference, error) {
	pod, err := client.CoreV1().Pods(namespace).Get(ctx, podName, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("reading the plugin's pod %s/%s: %w", namespace, podName, err)
	}
	ref := metav1.GetControllerOf(pod)
	if ref == nil {
		return nil, nil
	}
	// Owned, not controlled: the DaemonSet must not adopt or count them.
	return &metav1.OwnerReference{APIVersion: ref.APIVersion, Kind: ref.Kind, Name: ref.Name, UID: ref.UID}, nil
}
