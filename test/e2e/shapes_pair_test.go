package e2e

import (
	"context"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

// TestShapeNUMAPair applies demo/shapes/numa-pair.yaml on a simulated
// 8 x H100 node (two NUMA nodes of 4 GPUs) with the real scheduler, after
// a job has taken three GPUs: the free ones are one on NUMA node 0 and four
// on 1, so two GPUs picked without the alignment could straddle both. The
// pod of the shape runs with two GPUs whose published numaNode is the same,
// and the shape then counts 1 more pair placeable (the rest of NUMA node 1).
func TestShapeNUMAPair(t *testing.T) {
	rc, file, objs := startShapeDemo(t, "numa-pair.yaml")
	ctx := framework.Context(t, 4*time.Minute)
	const ns = "shapes-pair"
	cp.DeleteNamespaceAtCleanup(t, ns)
	var pods, rest []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == "Pod" {
			pods = append(pods, o)
		} else {
			rest = append(rest, o)
		}
	}
	if _, _, err := cp.ApplyObjects(ctx, file, rest, ""); err != nil {
		t.Fatal(err)
	}
	waitForShape(t, "h100-numa-pair", "placeable 4", func(s *gpuaas.GpuShape) bool { return s.Status.Placeable == 4 })
	holdGPUs(t, ctx, ns, "pair-h100", 3)
	if _, _, err := cp.ApplyObjects(ctx, file, pods, ""); err != nil {
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
	s := waitForShape(t, "h100-numa-pair", "placeable 1 with one pair and three GPUs taken", func(s *gpuaas.GpuShape) bool {
		return s.Status.ObservedGeneration > 0 && s.Status.Placeable == 1
	})
	t.Logf("pair on NUMA node %d; shape placeable %d (%s)", numa[0], s.Status.Placeable, s.Status.PlaceableMessage)
	rc.alive(t)
}

// holdGPUs runs a pod holding count devices of class in ns until the test
// ends.
func holdGPUs(t *testing.T, ctx context.Context, ns, class string, count int64) {
	t.Helper()
	if err := createClaim(ctx, gpuClaim(ns, "held", class, count)); err != nil {
		t.Fatal(err)
	}
	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "holder"},
		Spec: v1.PodSpec{
			ResourceClaims: []v1.PodResourceClaim{{Name: "gpus", ResourceClaimName: ptr.To("held")}},
			Containers: []v1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10",
				Resources: v1.ResourceRequirements{Claims: []v1.ResourceClaim{{Name: "gpus"}}}}},
		},
	}
	if _, err := cp.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	runningPod(t, ctx, ns, "holder")
}
