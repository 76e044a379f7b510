package e2e

import (
	"context"
	"encoding/json"
	"path/filepath"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

// BenchmarkSliceAPICost measures what one node's ResourceSlices cost the
// API (issue 14 item 3), for the node configurations that matter: every
// GPU whole, the demo's mix (whole, 4 replicas, a share, 2 dynamic MIG) and
// every GPU in dynamic MIG (26 devices and a counter set per GPU). Per
// node: slices, devices, bytes (protobuf, as etcd stores them, and JSON),
// the time from starting the plugin to its pool being complete, and, per
// iteration, a plugin restart: the time until the new plugin is registered
// with its pool complete, and how many slices the restart rewrote (none,
// when nothing changed). A cluster's figures are the node's times its
// node count: slices are per node.
//
//	make k8s-bins && E2E_REQUIRED=1 go test ./test/e2e -run '^$' -bench SliceAPICost -benchtime 5x
func BenchmarkSliceAPICost(b *testing.B) {
	dynamic := writeNodeConfig(b, "dynamic", "default: {mig: dynamic}\n")
	for _, c := range []struct{ name, nodeConfig string }{
		{"whole", ""},
		{"whole-without-unit-counters", writeNodeConfig(b, "whole-no-units", "gpuUnitCounters: false\n")},
		{"demo-mix", filepath.Join(repoRoot, "demo", "node-config.yaml")},
		{"all-dynamic-mig", dynamic},
	} {
		b.Run(c.name, func(b *testing.B) { benchSliceCost(b, "slices-"+c.name, c.nodeConfig) })
	}
}

func benchSliceCost(b *testing.B, name, nodeConfig string) {
	ctx := framework.Context(b, 5*time.Minute)
	start := time.Now()
	node, err := cp.StartNode(ctx, framework.NodeOptions{Name: name, PluginBinary: pluginBinary, NodeConfig: nodeConfig})
	if err != nil {
		b.Fatalf("starting node: %v", err)
	}
	published := time.Since(start)
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = node.Stop(ctx)
	})
	slices, err := node.ResourceSlices(ctx)
	if err != nil {
		b.Fatal(err)
	}
	devices, protoBytes, jsonBytes := sliceCost(b, slices)
	rewrites := 0
	for b.Loop() {
		before := resourceVersions(slices)
		if err := node.RestartPlugin(ctx); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		time.Sleep(2 * time.Second) // let a rewrite, if any, land
		if slices, err = node.ResourceSlices(ctx); err != nil {
			b.Fatal(err)
		}
		for name, rv := range resourceVersions(slices) {
			if before[name] != rv {
				rewrites++
			}
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(len(slices)), "slices/node")
	b.ReportMetric(float64(devices), "devices/node")
	b.ReportMetric(float64(protoBytes), "proto-bytes/node")
	b.ReportMetric(float64(jsonBytes), "json-bytes/node")
	b.ReportMetric(published.Seconds(), "first-publish-s")
	b.ReportMetric(float64(rewrites)/float64(b.N), "slice-writes/restart")
}

// sliceCost counts the devices and bytes of slices.
func sliceCost(b *testing.B, slices []resourceapi.ResourceSlice) (devices, protoBytes, jsonBytes int) {
	for i := range slices {
		s := slices[i].DeepCopy()
		s.ManagedFields = nil // what the API server adds is not ours
		devices += len(s.Spec.Devices)
		protoBytes += s.Size()
		data, err := json.Marshal(s)
		if err != nil {
			b.Fatal(err)
		}
		jsonBytes += len(data)
	}
	return devices, protoBytes, jsonBytes
}

func resourceVersions(slices []resourceapi.ResourceSlice) map[string]string {
	out := make(map[string]string, len(slices))
	for _, s := range slices {
		out[s.Name] = s.ResourceVersion
	}
	return out
}
