package mps

import (
	"context"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"

	"github.com/gpuaas/gpu-dra-driver/pkg/timeslice"
)

func podLauncher() (*PodLauncher, *fake.Clientset) {
	client := fake.NewClientset()
	// The fake tracker does not generate names as the API server does.
	var n int
	client.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		pod := a.(k8stesting.CreateAction).GetObject().(*corev1.Pod)
		if pod.Name == "" {
			n++
			pod.Name = fmt.Sprintf("%s%d", pod.GenerateName, n)
		}
		return false, nil, nil
	})
	return &PodLauncher{
		Client: client, Namespace: "gpuaas-system", NodeName: "node-a", Image: "gpuaas:1",
		DriverRoot: "/host", HostDriverRoot: "/",
		Owner: &metav1.OwnerReference{APIVersion: "apps/v1", Kind: "DaemonSet", Name: "plugin", UID: "ds-uid"},
	}, client
}

func daemonOf(gpu string) Daemon {
	return Daemon{GPU: gpu, Dir: "/var/lib/p/mps/" + gpu, ShmDir: "/var/lib/p/mps/" + gpu + "/shm",
		Command: timeslice.Cmd{Path: "/host/usr/bin/nvidia-cuda-mps-control", Env: []string{"CUDA_VISIBLE_DEVICES=" + gpu}}}
}

func listPods(t *testing.T, c *fake.Clientset) []corev1.Pod {
	t.Helper()
	l, err := c.CoreV1().Pods("gpuaas-system").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return l.Items
}

// TestPodLauncherRunsDaemonOnItsNode: the daemon pod is bound to the node,
// owned by the plugin's DaemonSet (uninstall removes it), and runs the
// control binary in the foreground inside the driver root (chroot, the
// driver's own libraries and PATH), in the host's PID namespace (an MPS
// server finds itself in the root's /proc, a host's), with the GPU's
// directory and shm mounted into the root.
func TestPodLauncherRunsDaemonOnItsNode(t *testing.T) {
	l, c := podLauncher()
	ctx := context.Background()
	if err := l.Launch(ctx, daemonOf(gpu)); err != nil {
		t.Fatal(err)
	}
	if err := l.Launch(ctx, daemonOf(gpu)); err != nil {
		t.Fatal(err)
	}
	pods := listPods(t, c)
	if len(pods) != 1 {
		t.Fatalf("%d pods after launching twice, want 1", len(pods))
	}
	p := pods[0]
	ctr := p.Spec.Containers[0]
	if p.Spec.NodeName != "node-a" || p.Spec.RestartPolicy != corev1.RestartPolicyOnFailure || !p.Spec.HostNetwork ||
		len(p.OwnerReferences) != 1 || p.OwnerReferences[0].UID != "ds-uid" || ptr.Deref(p.OwnerReferences[0].Controller, false) {
		t.Errorf("pod %s: node %q restart %s owners %+v", p.Name, p.Spec.NodeName, p.Spec.RestartPolicy, p.OwnerReferences)
	}
	if want := "/usr/bin/dra-kubelet-plugin exec-in-driver-root /driver-root /usr/bin/nvidia-cuda-mps-control -f"; ctr.Image != "gpuaas:1" || strings.Join(ctr.Command, " ") != want {
		t.Errorf("container %s %v, want %s", ctr.Image, ctr.Command, want)
	}
	if !p.Spec.HostPID {
		t.Errorf("pod %s is not in the host's PID namespace", p.Name)
	}
	// A privileged pod with an API token would hand whoever can read its
	// node that account's rights; the daemon needs none.
	if p.Spec.ServiceAccountName != "default" || ptr.Deref(p.Spec.AutomountServiceAccountToken, true) {
		t.Errorf("pod %s runs as %q with token automount %v, want the default account and no token",
			p.Name, p.Spec.ServiceAccountName, p.Spec.AutomountServiceAccountToken)
	}
	env := map[string]string{}
	for _, e := range ctr.Env {
		env[e.Name] = e.Value
	}
	if env["PATH"] == "" || !strings.Contains(env["PATH"], "/usr/bin") || env[EnvPipeDir] != "/tmp/pipe" || env[EnvLogDir] != "/tmp/log" || env["CUDA_VISIBLE_DEVICES"] != gpu {
		t.Errorf("daemon env %v: want the driver's PATH, pipe and log directories below /tmp of the root, and the GPU", env)
	}
	mounts := map[string]string{}
	for _, m := range ctr.VolumeMounts {
		for _, v := range p.Spec.Volumes {
			if v.Name == m.Name {
				mounts[m.MountPath] = v.HostPath.Path
			}
		}
	}
	want := map[string]string{"/driver-root": "/", "/driver-root/tmp": "/var/lib/p/mps/" + gpu, "/driver-root/dev/shm": "/var/lib/p/mps/" + gpu + "/shm"}
	for path, host := range want {
		if mounts[path] != host {
			t.Errorf("%s mounted from %q, want %q (all: %v)", path, mounts[path], host, mounts)
		}
	}
}

// TestPodLauncherReplacesFinishedDaemon: a pod whose daemon quit (or
// failed) is replaced; Remove deletes the GPU's pods and no other GPU's.
func TestPodLauncherReplacesFinishedDaemon(t *testing.T) {
	l, c := podLauncher()
	ctx := context.Background()
	const other = "GPU-87654321-bbbb"
	for _, g := range []string{gpu, other} {
		if err := l.Launch(ctx, daemonOf(g)); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range listPods(t, c) {
		if p.Annotations["gpu.gpuaas.io/gpu-uuid"] == gpu {
			p.Status.Phase = corev1.PodSucceeded
			if _, err := c.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, &p, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := l.Launch(ctx, daemonOf(gpu)); err != nil {
		t.Fatal(err)
	}
	var live int
	for _, p := range listPods(t, c) {
		if p.Annotations["gpu.gpuaas.io/gpu-uuid"] == gpu && p.Status.Phase != corev1.PodSucceeded {
			live++
		}
	}
	if live != 1 {
		t.Errorf("%d live pods for the GPU after relaunch, want 1", live)
	}
	if err := l.Remove(ctx, gpu); err != nil {
		t.Fatal(err)
	}
	if pods := listPods(t, c); len(pods) != 1 || pods[0].Annotations["gpu.gpuaas.io/gpu-uuid"] != other {
		t.Errorf("after Remove: %v", pods)
	}
}

func TestPodLauncherRefusesBinaryOutsideDriverRoot(t *testing.T) {
	l, c := podLauncher()
	d := daemonOf(gpu)
	d.Command.Path = "/usr/bin/nvidia-cuda-mps-control" // the plugin's own root, not /host
	if err := l.Launch(context.Background(), d); err == nil || len(listPods(t, c)) > 0 {
		t.Errorf("Launch = %v: a daemon pod would run a binary from outside the driver root", err)
	}
}
