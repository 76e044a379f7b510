package e2e

import (
	"path/filepath"
	"testing"
	"time"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

// TestShapeNUMAPair applies demo/shapes/numa-pair.yaml on a simulated
// 8 x H100 node (two NUMA nodes of 4 GPUs) with the real scheduler: the
// pod of the shape runs with two GPUs whose published numaNode is the
// same, and the shape then counts 3 more pairs placeable.
func TestShapeNUMAPair(t *testing.T) {
	dir := filepath.Join(repoRoot, "demo", "shapes")
	startNodeWith(t, framework.NodeOptions{Name: nodeName(t), NodeConfig: filepath.Join(dir, "node-config.yaml")})
	rc := startController(t)
	ctx := framework.Context(t, 4*time.Minute)
	file := filepath.Join(dir, "numa-pair.yaml")
	objs, err := framework.ReadObjects(file)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if o.GetNamespace() == "" && o.GetKind() != "Namespace" {
			deleteAtCleanup(t, o)
		}
	}
	const ns = "shapes-pair"
	cp.DeleteNamespaceAtCleanup(t, ns)
	if _, _, err := cp.ApplyObjects(ctx, file, objs, ""); err != nil {
		t.Fatal(err)
	}
	pod := runningPod(t, ctx, ns, "trainer")
	claims := podClaims(t, ctx, pod)
	if len(claims) != 1 || claims[0].Status.Allocation == nil || len(claims[0].Status.Allocation.Devices.Results) != 2 {
		t.Fatalf("the pair's claims: %+v", claims)
	}
	devices, err := cp.PoolDevices(ctx, nodeName(t))
	if err != nil {
		t.Fatal(err)
	}
	attrs := deviceAttrs(devices)
	var numa []int64
	for _, r := range claims[0].Status.Allocation.Devices.Results {
		n, ok := intAttr(attrs[r.Device], "resource.kubernetes.io/numaNode")
		if !ok {
			t.Fatalf("allocated GPU %s publishes no numaNode", r.Device)
		}
		numa = append(numa, n)
	}
	if numa[0] != numa[1] {
		t.Fatalf("the pair's GPUs are on NUMA nodes %v, want one", numa)
	}
	s := waitForShape(t, "h100-numa-pair", "placeable 3 with one pair taken", func(s *gpuaas.GpuShape) bool {
		return s.Status.ObservedGeneration > 0 && s.Status.Placeable == 3
	})
	t.Logf("pair on NUMA node %d; shape placeable %d (%s)", numa[0], s.Status.Placeable, s.Status.PlaceableMessage)
	rc.alive(t)
}
