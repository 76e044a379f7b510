package peer

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
	"github.com/gpuaas/gpu-dra-driver/test/fleet"
)

// The slice shapes the run keeps under PEER_SLICES_OUT, a directory each,
// for test/e2e/scale's BenchmarkPeerShapes.
const (
	shapeWhole      = "whole-gpu"
	shapeDynamicMIG = "dynamic-mig"
)

// dynamicMIGConfig offers every GPU as dynamic MIG: the whole GPU and
// every MIG placement, made when a claim is prepared.
const dynamicMIGConfig = "apiVersion: gpu.gpuaas.io/v1alpha1\nkind: NodeConfig\ndefault: {mig: dynamic}\n"

// captureDynamicMIG keeps what both plugins publish for a simulated
// 8 x H100 whose GPUs they partition on demand: ours with every GPU offered
// as dynamic MIG, NVIDIA's with its DynamicMIG gate (alpha, off by
// default). It uses a node and machine of its own, so the prepares measured
// on peer-node stay on whole GPUs, as NVIDIA's defaults are.
func captureDynamicMIG(ctx context.Context, dir string) error {
	config := filepath.Join(cp.Dir, "peer-dynamic-mig.yaml")
	if err := os.WriteFile(config, []byte(dynamicMIGConfig), 0o600); err != nil {
		return fmt.Errorf("writing the dynamic MIG node configuration: %w", err)
	}
	node, err := cp.StartNode(ctx, framework.NodeOptions{
		Name: "peer-mig", PluginBinary: pluginBinary, NVMLLibrary: nvmlLibrary,
		NVML: "mock:dgxh100", Verbosity: 1, NodeConfig: config,
	})
	if err != nil {
		return err
	}
	defer func() { _ = node.Stop(context.WithoutCancel(ctx)) }()
	nv, err := startNVIDIA(ctx, node, os.Getenv(envPlugin), node.Plugin.Env, "--feature-gates=DynamicMIG=true")
	if err != nil {
		return err
	}
	defer func() { nv.close(); _ = nv.proc.Stop() }()
	for _, d := range []*driver{{label: "gpuaas", name: framework.DriverName, proc: node.Plugin}, nv} {
		// More than the whole GPUs: the MIG placements are published too.
		slices, err := waitPool(ctx, d, node.Name, len(gpus)+1)
		if err != nil {
			return err
		}
		if err := fleet.WriteCapture(filepath.Join(dir, shapeDynamicMIG), d.name, slices); err != nil {
			return err
		}
		devices := 0
		for _, s := range slices {
			devices += len(s.Spec.Devices)
		}
		fmt.Fprintf(os.Stderr, "peer: %s publishes %d slices, %d devices with dynamic MIG\n", d.label, len(slices), devices)
	}
	return nil
}

// waitPool waits until d's pool on node is stored whole (every slice of
// one generation, as many as the pool says) with at least minDevices
// devices, and returns its slices.
func waitPool(ctx context.Context, d *driver, node string, minDevices int) ([]resourceapi.ResourceSlice, error) {
	var items []resourceapi.ResourceSlice
	devices := 0
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := cp.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{
			FieldSelector: "spec.driver=" + d.name + ",spec.nodeName=" + node,
		})
		if err != nil {
			return false, err
		}
		items, devices = list.Items, 0
		generations := map[int64]bool{}
		for _, s := range items {
			devices += len(s.Spec.Devices)
			generations[s.Spec.Pool.Generation] = true
		}
		whole := len(items) > 0 && len(generations) == 1 && int64(len(items)) == items[0].Spec.Pool.ResourceSliceCount
		return whole && devices >= minDevices, nil
	})
	if err != nil {
		return nil, fmt.Errorf("%s: waiting for its whole pool on %s with at least %d devices (have %d in %d slices; log %s): %w",
			d.label, node, minDevices, devices, len(items), d.proc.LogPath, err)
	}
	return items, nil
}
