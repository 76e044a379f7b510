package e2e

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

// TestShapeWholeNodeLease applies demo/shapes/whole-node-lease.yaml on a
// simulated 8 x H100 node (every GPU dynamic MIG) with the real scheduler:
// the lease's pod runs with all 8 GPUs; the shape then counts 0 placeable
// and a second lease's claim is refused with issue 38's message (the pod
// is told why); a MIG claim is not allocated while the lease holds the
// node, and is once the lease's pod is gone. The node's GpuNode is
// ExclusivelyAllocated while the lease holds it.
func TestShapeWholeNodeLease(t *testing.T) {
	rc, file, objs := startShapeDemo(t, "whole-node-lease.yaml")
	ctx := framework.Context(t, 5*time.Minute)
	cp.DeleteNamespaceAtCleanup(t, "shapes-training")
	if _, _, err := cp.ApplyObjects(ctx, file, objs, ""); err != nil {
		t.Fatal(err)
	}
	const ns = "shapes-training"
	pod := runningPod(t, ctx, ns, "trainer")
	claims := podClaims(t, ctx, pod)
	if len(claims) != 1 || claims[0].Status.Allocation == nil || len(claims[0].Status.Allocation.Devices.Results) != 8 {
		t.Fatalf("the lease's claims: %+v", claims)
	}
	waitForShape(t, "h100-node", "placeable 0", func(s *gpuaas.GpuShape) bool {
		return s.Status.ObservedGeneration > 0 && s.Status.Placeable == 0 && s.Status.PlaceableMessage == "0 of 1 nodes have a free GPUS (all of the node)"
	})
	lease := ns + "/" + claims[0].Name
	waitNodePosture(t, nodeName(t), "leased", func(s *gpuaas.GpuNodeStatus) bool {
		return s.Posture == gpuaas.PostureExclusivelyAllocated &&
			s.Reason == "8 GPUs leased to "+lease+" (allocationMode All); 8 GPUs: 8 AllocatedWhole"
	})

	second := pod.DeepCopy()
	second.ObjectMeta = metav1.ObjectMeta{Namespace: ns, Name: "second-trainer"}
	second.Status = v1.PodStatus{}
	second.Spec.NodeName = ""
	if _, err := cp.Client.CoreV1().Pods(ns).Create(ctx, second, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitShapeUnavailable(t, ctx, ns, "second-trainer", "unavailable: shape h100-node has 0 placeable (0 of 1 nodes have a free GPUS (all of the node))")
	if p, err := cp.Client.CoreV1().Pods(ns).Get(ctx, "second-trainer", metav1.GetOptions{}); err != nil || p.Spec.NodeName != "" || len(p.Status.ResourceClaimStatuses) > 0 && p.Status.ResourceClaimStatuses[0].ResourceClaimName != nil {
		t.Fatalf("the second lease got a claim or a node: %+v %v", p.Status, err)
	}
	if err := cp.Client.CoreV1().Pods(ns).Delete(ctx, "second-trainer", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}

	// A MIG device of the leased node's GPUs: not while the lease holds it.
	createOneMIGClaim(t, ns, "mig")
	migPod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "mig-user"},
		Spec: v1.PodSpec{
			ResourceClaims: []v1.PodResourceClaim{{Name: "mig", ResourceClaimName: ptr.To("mig")}},
			Containers: []v1.Container{{Name: "c", Image: pod.Spec.Containers[0].Image,
				Resources: v1.ResourceRequirements{Claims: []v1.ResourceClaim{{Name: "mig"}}}}},
		},
	}
	if _, err := cp.Client.CoreV1().Pods(ns).Create(ctx, migPod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Second) // the scheduler has tried it
	if c, err := cp.Client.ResourceV1().ResourceClaims(ns).Get(ctx, "mig", metav1.GetOptions{}); err != nil || c.Status.Allocation != nil {
		t.Fatalf("the MIG claim was allocated while the lease holds the node: %v %v", c.Status.Allocation, err)
	}
	if err := cp.Client.CoreV1().Pods(ns).Delete(ctx, "trainer", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	runningPod(t, ctx, ns, "mig-user")
	// A MIG device on one GPU: the node is no longer leased.
	waitNodePosture(t, nodeName(t), "partly allocated after the lease", func(s *gpuaas.GpuNodeStatus) bool {
		return s.Posture == gpuaas.PosturePartiallyAllocated
	})
	waitForShape(t, "h100-node", "placeable 0 with a MIG device taken", func(s *gpuaas.GpuShape) bool { return s.Status.Placeable == 0 })
	rc.alive(t)
}

// waitShapeUnavailable waits for the webhook's ShapeUnavailable event on
// pod, whose claim the shape refused, with a note containing want.
func waitShapeUnavailable(t *testing.T, ctx context.Context, ns, pod, want string) {
	t.Helper()
	err := wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		evs, err := cp.Client.EventsV1().Events(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		for _, e := range evs.Items {
			if e.Regarding.Name == pod && e.Reason == "ShapeUnavailable" && strings.Contains(e.Note, want) {
				t.Logf("event on pod %s: %s", pod, e.Note)
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("no ShapeUnavailable event on pod %s: %v", pod, err)
	}
}

// waitNodePosture waits until the GpuNode of node has a status cond accepts.
func waitNodePosture(t testing.TB, node, what string, cond func(*gpuaas.GpuNodeStatus) bool) {
	t.Helper()
	ctx := framework.Context(t, time.Minute)
	var n gpuaas.GpuNode
	err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		if err := ctrlClient.Get(ctx, types.NamespacedName{Name: node}, &n); err != nil {
			return false, client.IgnoreNotFound(err)
		}
		return cond(&n.Status), nil
	})
	if err != nil {
		t.Fatalf("GpuNode %s not %s: %v; posture %s %q", node, what, err, n.Status.Posture, n.Status.Reason)
	}
	t.Logf("GpuNode %s %s: %s %q", node, what, n.Status.Posture, n.Status.Reason)
}

// startShapeDemo starts a simulated node as demo/shapes/node-config.yaml
// describes it and a controller, and reads the demo file of demo/shapes,
// whose cluster-scoped objects are deleted when the test ends.
func startShapeDemo(t *testing.T, name string) (*runningController, string, []*unstructured.Unstructured) {
	t.Helper()
	dir := filepath.Join(repoRoot, "demo", "shapes")
	startNodeWith(t, framework.NodeOptions{Name: nodeName(t), NodeConfig: filepath.Join(dir, "node-config.yaml")})
	rc := startController(t)
	file := filepath.Join(dir, name)
	objs, err := framework.ReadObjects(file)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if o.GetNamespace() == "" && o.GetKind() != "Namespace" {
			deleteAtCleanup(t, o)
		}
	}
	return rc, file, objs
}
