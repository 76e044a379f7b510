package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

// TestShapePlaceableMatchesScheduler: on a simulated 8 x H100 node with
// the real scheduler, a shape of two GPUs (whenUnavailable Queue) counts 4
// placeable; exactly that many pods of its template all run, the count
// goes to 0, and one more pod is admitted and waits unschedulable.
func TestShapePlaceableMatchesScheduler(t *testing.T) {
	startNodeWith(t, framework.NodeOptions{Name: nodeName(t), NodeConfig: filepath.Join(repoRoot, "demo", "shapes", "node-config.yaml")})
	startController(t)
	ctx := framework.Context(t, 5*time.Minute)
	name := uniqueName("pair")
	createObject(t, profile(name, gpuaas.ProfileSelector{Type: gpuaas.DeviceTypeGPU}))
	waitForProfileReady(t, name)
	ns := cp.CreateNamespace(t, "pair")
	createObject(t, quotaFor(name, []string{ns}, gpuaas.QuotaLimits{}))
	createObject(t, &gpuaas.GpuShape{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: gpuaas.GpuShapeSpec{
			Requests: []gpuaas.ShapeRequest{{Name: "gpus", Profile: name, Count: ptr.To[int64](2)}},
			Tenants:  []string{name},
		},
	})
	s := waitForShape(t, name, "placeable 4", func(s *gpuaas.GpuShape) bool { return s.Status.Templates == 1 && s.Status.Placeable == 4 })
	t.Logf("placeable %d: %s", s.Status.Placeable, s.Status.PlaceableMessage)

	pod := func(i int) *v1.Pod {
		return &v1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("pair-%d", i)},
			Spec: v1.PodSpec{
				ResourceClaims: []v1.PodResourceClaim{{Name: "pair", ResourceClaimTemplateName: ptr.To(name)}},
				Containers: []v1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10",
					Resources: v1.ResourceRequirements{Claims: []v1.ResourceClaim{{Name: "pair"}}}}},
			},
		}
	}
	for i := range 5 {
		if _, err := cp.Client.CoreV1().Pods(ns).Create(ctx, pod(i), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// The scheduler picks the order, not the pod names: any four run and
	// the one left over waits (the CI run here had pair-4 run and pair-2 wait).
	running, waiting := 0, ""
	err := wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		pods, err := cp.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		running, waiting = 0, ""
		for _, p := range pods.Items {
			if p.Status.Phase == v1.PodRunning {
				running++
			}
			for _, c := range p.Status.Conditions {
				if c.Type == v1.PodScheduled && c.Status == v1.ConditionFalse && c.Reason == v1.PodReasonUnschedulable {
					waiting = p.Name + ": " + c.Message
				}
			}
		}
		return running == 4 && waiting != "", nil
	})
	if err != nil {
		t.Fatalf("want 4 of the 5 pods running and the fifth unschedulable, have %d running, waiting %q: %v", running, waiting, err)
	}
	t.Logf("4 pods run; the fifth waits: %s", waiting)
	waitForShape(t, name, "placeable 0", func(s *gpuaas.GpuShape) bool { return s.Status.Placeable == 0 })
}
