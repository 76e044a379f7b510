package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

// BenchmarkSchedulingThroughput measures pods/s of the real kube-scheduler
// placing one-device claims on our slices: whole GPUs versus dynamic MIG
// (partitionable devices with counters), each with and without the
// gpu-milliunits counter that Kueue charges, on the same number of
// simulated 8 x H100 nodes with the real plugin. Each iteration creates the
// pods, waits until all are bound, and deletes them (not timed).
//
//	make k8s-bins && E2E_REQUIRED=1 go test ./test/e2e -run '^$' -bench Scheduling -benchtime 3x
func BenchmarkSchedulingThroughput(b *testing.B) {
	const nodes, pods = 4, 32
	// The gpu-milliunits counter (Kueue's GPU units) is on by default; the
	// modes without it measure what it costs the scheduler.
	noUnits := writeNodeConfig(b, "whole-no-units", "gpuUnitCounters: false\n")
	dynamic := writeNodeConfig(b, "dynamic", "default: {mig: dynamic}\n")
	dynamicNoUnits := writeNodeConfig(b, "dynamic-no-units", "default: {mig: dynamic}\ngpuUnitCounters: false\n")
	for _, mode := range []struct{ name, nodeConfig, class string }{
		{"whole-gpu", "", "gpu.gpuaas.io"},
		{"whole-gpu-without-unit-counters", noUnits, "gpu.gpuaas.io"},
		{"dynamic-mig-1g", dynamic, "mig-1g.10gb.gpuaas.io"},
		{"dynamic-mig-1g-without-unit-counters", dynamicNoUnits, "mig-1g.10gb.gpuaas.io"},
	} {
		b.Run(mode.name, func(b *testing.B) {
			startBenchNodes(b, nodes, mode.name, mode.nodeConfig)
			ns := cp.CreateNamespace(b, "sched")
			var total time.Duration
			for b.Loop() {
				total += scheduleBatch(b, ns, mode.class, pods)
			}
			b.ReportMetric(float64(pods*b.N)/total.Seconds(), "pods/s")
		})
	}
}

// writeNodeConfig writes a plugin --node-config with the given body.
func writeNodeConfig(tb testing.TB, name, body string) string {
	tb.Helper()
	path := filepath.Join(tb.TempDir(), name+".yaml")
	if err := os.WriteFile(path, []byte("apiVersion: gpu.gpuaas.io/v1alpha1\nkind: NodeConfig\n"+body), 0o600); err != nil {
		tb.Fatal(err)
	}
	return path
}

func startBenchNodes(b *testing.B, n int, prefix, nodeConfig string) {
	ctx := framework.Context(b, 3*time.Minute)
	for i := range n {
		node, err := cp.StartNode(ctx, framework.NodeOptions{Name: fmt.Sprintf("bench-%s-%d", prefix, i),
			PluginBinary: pluginBinary, NodeConfig: nodeConfig})
		if err != nil {
			b.Fatalf("starting node: %v", err)
		}
		b.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			_ = node.Stop(ctx)
		})
	}
}

// scheduleBatch creates pods one-device pods and returns the time from the
// first creation until the last pod is bound; it then deletes them.
func scheduleBatch(b *testing.B, ns, class string, pods int) time.Duration {
	ctx := framework.Context(b, 3*time.Minute)
	b.StopTimer()
	tmpl := fmt.Sprintf("one-%d", time.Now().UnixNano())
	if _, err := cp.Client.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, templateFor(tmpl, ns, class), metav1.CreateOptions{}); err != nil {
		b.Fatalf("creating ResourceClaimTemplate: %v", err)
	}
	b.StartTimer()
	start := time.Now()
	for i := range pods {
		createPod(b, ctx, ns, fmt.Sprintf("%s-%d", tmpl, i), tmpl)
	}
	err := wait.PollUntilContextCancel(ctx, 20*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		list, err := cp.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		bound := 0
		for _, p := range list.Items {
			if p.Spec.NodeName != "" {
				bound++
			}
		}
		return bound == pods, nil
	})
	elapsed := time.Since(start)
	b.StopTimer()
	if err != nil {
		b.Fatalf("waiting for %d pods to be bound: %v", pods, err)
	}
	if err := cp.Client.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		b.Fatal(err)
	}
	if err := cp.WaitForNoPods(ctx, ns); err != nil {
		b.Fatal(err)
	}
	b.StartTimer()
	return elapsed
}
