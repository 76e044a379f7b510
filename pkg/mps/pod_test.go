package mps

import (
	"context"
	"fmt"
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
// owned by the plugin's DaemonSet (uninstall removes it), runs the control
// binary in the foreground where the plugin sees the driver root, and
// mounts the GPU's directory at its host path and its shm at /dev/shm.
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
	if ctr.Image != "gpuaas:1" || len(ctr.Command) != 2 || ctr.Command[0] != "/host/usr/bin/nvidia-cuda-mps-control" || ctr.Command[1] != "-f" {
		t.Errorf("container %s %v", ctr.Image, ctr.Command)
	}
	mounts := map[string]string{}
	for _, m := range ctr.VolumeMounts {
		for _, v := range p.Spec.Volumes {
			if v.Name == m.Name {
				mounts[m.MountPath] = v.HostPath.Path
			}
		}
	}
	want := map[string]string{"/host": "/", "/var/lib/p/mps/" + gpu: "/var/lib/p/mps/" + gpu, "/dev/shm": "/var/lib/p/mps/" + gpu + "/shm"}
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

func TestPodLauncherRefusesDriverRootAtSlash(t *testing.T) {
	l, _ := podLauncher()
	l.DriverRoot = "/"
	if err := l.Launch(context.Background(), daemonOf(gpu)); err == nil {
		t.Error("a daemon pod would mount the driver root over its own root")
	}
}
