package e2e

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

// BenchmarkRealNodePluginRestart is the restart rows of the side-by-side
// table (BenchmarkPeerRestart) on the real node, where the plugin is a
// pod of the chart's DaemonSet: the real kubelet's plugin watcher
// registers it and the real kubelet and containerd start the pods. Each
// restart deletes the plugin pod, as a rollout or an eviction does, and at
// once creates a pod that waits for a whole GPU; timed from the delete:
// the new plugin pod ready, and the waiting pod running, which needs the
// new plugin's prepare (its kubelet retries it while no plugin is
// registered). REAL_RESTARTS restarts (default 5):
//
//	E2E_REQUIRED=1 go test ./test/e2e -run '^$' -bench BenchmarkRealNodePluginRestart -benchtime 1x -v
func BenchmarkRealNodePluginRestart(b *testing.B) {
	requireRealNode(b)
	restarts := envInt(b, "REAL_RESTARTS", 5)
	node := startRealNode(b)
	ctx := framework.Context(b, 30*time.Minute)
	helm := helmBin(b)
	uninstallOnCleanup(b, ctx, helm)
	values, err := node.ChartValues(2)
	if err != nil {
		b.Fatal(err)
	}
	if err := node.InstallChart(ctx, helm, releaseName, releaseNamespace, values); err != nil {
		b.Fatal(err)
	}
	plugin, err := cp.WaitForPluginPod(ctx, releaseNamespace, "")
	if err != nil {
		b.Fatal(err)
	}
	if _, err := node.WaitForDevices(ctx, 8); err != nil {
		b.Fatal(err)
	}
	ns := cp.CreateNamespace(b, "real-restart")
	if _, err := cp.Client.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, templateFor("one-gpu", ns, "gpu.gpuaas.io"), metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	var ready, running []time.Duration
	b.ResetTimer()
	for i := range restarts {
		r, w, next, err := restartPluginPod(ctx, ns, fmt.Sprintf("waiting-%d", i), plugin.UID)
		if err != nil {
			b.Fatalf("restart %d: %v", i+1, err)
		}
		ready, running, plugin = append(ready, r), append(running, w), next
	}
	b.StopTimer()
	b.ReportMetric(msAt(ready, 0.5), "ready-p50-ms")
	b.ReportMetric(msAt(ready, 0.99), "ready-p99-ms")
	b.ReportMetric(msAt(running, 0.5), "pod-running-p50-ms")
	b.ReportMetric(msAt(running, 0.99), "pod-running-p99-ms")
	b.Logf("real node, %d plugin pod restarts: new plugin pod ready p50 %.0f ms / p99 %.0f ms; the waiting pod running p50 %.0f ms / p99 %.0f ms",
		restarts, msAt(ready, 0.5), msAt(ready, 0.99), msAt(running, 0.5), msAt(running, 0.99))
}

// restartPluginPod deletes the plugin pod old, creates the waiting pod
// name, and times the new plugin pod's readiness and the pod's start from
// the delete; it deletes the waiting pod again.
func restartPluginPod(ctx context.Context, ns, name string, old types.UID) (ready, running time.Duration, plugin *v1.Pod, err error) {
	pods, err := cp.ComponentPods(ctx, releaseNamespace, "kubelet-plugin")
	if err != nil || len(pods) != 1 || pods[0].UID != old {
		return 0, 0, nil, fmt.Errorf("want the one plugin pod %s, got %d pods: %w", old, len(pods), err)
	}
	start := time.Now()
	if err := cp.Client.CoreV1().Pods(releaseNamespace).Delete(ctx, pods[0].Name, metav1.DeleteOptions{}); err != nil {
		return 0, 0, nil, fmt.Errorf("deleting plugin pod %s: %w", pods[0].Name, err)
	}
	waiting := templateWorkloadPod(ns, name, "one-gpu")
	if _, err := cp.Client.CoreV1().Pods(ns).Create(ctx, waiting, metav1.CreateOptions{}); err != nil {
		return 0, 0, nil, fmt.Errorf("creating pod %s: %w", name, err)
	}
	readyAt := make(chan time.Duration, 1)
	go func() {
		if _, err := cp.WaitForPluginPod(ctx, releaseNamespace, old); err == nil {
			readyAt <- time.Since(start)
		}
		close(readyAt)
	}()
	if _, err := cp.WaitForPodRunning(ctx, ns, name); err != nil {
		return 0, 0, nil, fmt.Errorf("pod %s after the plugin's restart: %w", name, err)
	}
	running = time.Since(start)
	r, ok := <-readyAt
	if !ok {
		return 0, 0, nil, fmt.Errorf("no new plugin pod ready after %s", pods[0].Name)
	}
	if plugin, err = cp.WaitForPluginPod(ctx, releaseNamespace, old); err != nil {
		return 0, 0, nil, err
	}
	if err := cp.Client.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		return 0, 0, nil, fmt.Errorf("deleting pod %s: %w", name, err)
	}
	if err := cp.WaitForPodGone(ctx, ns, name); err != nil {
		return 0, 0, nil, err
	}
	return r, running, plugin, nil
}

// msAt is the q quantile of samples in milliseconds (the nearest rank).
func msAt(samples []time.Duration, q float64) float64 {
	s := slices.Clone(samples)
	slices.Sort(s)
	i := min(len(s)-1, int(q*float64(len(s))))
	return float64(s[i]) / float64(time.Millisecond)
}
