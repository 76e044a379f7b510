package e2e

import (
	"path/filepath"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

// TestShapeWholeNodeLeaseOnRealNode applies demo/shapes/whole-node-lease.yaml
// on the real node with the chart (the plugin on --nvml real over the
// simulated library, the demo node's GPU modes): the lease's container sees
// every whole GPU the node publishes; a MIG claim on the leased GPUs waits
// unschedulable while the lease holds them, and its pod runs, prepared on
// the real node, once the lease's pod is gone.
func TestShapeWholeNodeLeaseOnRealNode(t *testing.T) {
	requireRealNode(t)
	n := startRealNode(t)
	installChartForTest(t, n)
	installCRDs(t) // the typed client of waitForShape; the chart's CRDs are the same
	ctx := framework.Context(t, 6*time.Minute)
	const ns = "shapes-training"
	cp.DeleteNamespaceAtCleanup(t, ns)
	file := filepath.Join(repoRoot, "demo", "shapes", "whole-node-lease.yaml")
	objs := readWorkloadSpec(t, file)
	for _, o := range objs {
		if o.GetNamespace() == "" && o.GetKind() != "Namespace" {
			deleteAtCleanup(t, o)
		}
	}
	applyAll(t, ctx, file, objs)

	devices, err := n.WaitForDevices(ctx, 8)
	if err != nil {
		t.Fatal(err)
	}
	whole := 0
	for _, d := range devices {
		if stringAttr(d, "type") == "gpu" {
			whole++
		}
	}
	trainer := runningPod(t, ctx, ns, "trainer")
	claims := podClaims(t, ctx, trainer)
	if len(claims) != 1 || claims[0].Status.Allocation == nil || len(claims[0].Status.Allocation.Devices.Results) != whole {
		t.Fatalf("the lease's claims %+v, want one of the node's %d whole GPUs", claims, whole)
	}
	log, err := n.WaitForPodLog(ctx, ns, "trainer", trainer.Spec.Containers[0].Name, "gpuinfo done")
	if err != nil {
		t.Fatal(err)
	}
	if uuids, _ := parseGPUInfo(log); uuids.Len() != whole {
		t.Fatalf("the lease's container sees GPUs %v, want the node's %d whole GPUs\n%s", uuids.UnsortedList(), whole, log)
	}
	waitForShape(t, "h100-node", "placeable 0", func(s *gpuaas.GpuShape) bool { return s.Status.Placeable == 0 })
	t.Logf("the lease runs on the node's %d whole GPUs", whole)

	// A MIG device of a leased GPU (6 and 7 are dynamic MIG): it waits.
	createOneMIGClaim(t, ns, "mig")
	mig := workloadPod(ns, "mig-user")
	mig.Spec.ResourceClaims = []v1.PodResourceClaim{{Name: "mig", ResourceClaimName: ptr.To("mig")}}
	mig.Spec.Containers[0].Resources.Claims = []v1.ResourceClaim{{Name: "mig"}}
	if _, err := cp.Client.CoreV1().Pods(ns).Create(ctx, mig, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	msg, err := cp.WaitForPodUnschedulable(ctx, ns, "mig-user")
	if err != nil {
		t.Fatalf("the MIG pod does not wait while the lease holds the node: %v", err)
	}
	t.Logf("the MIG pod waits while the lease holds the node: %s", msg)
	if err := cp.Client.CoreV1().Pods(ns).Delete(ctx, "trainer", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}
	runningPod(t, ctx, ns, "mig-user")
	if log, err := n.WaitForPodLog(ctx, ns, "mig-user", "ctr", "gpuinfo done"); err != nil {
		t.Fatal(err)
	} else if uuids, _ := parseGPUInfo(log); uuids.Len() != 1 {
		t.Fatalf("the MIG pod's container sees %v, want one MIG device\n%s", uuids.UnsortedList(), log)
	}
}

// createOneMIGClaim creates claim name in ns: one MIG device of any
// profile, of our driver.
func createOneMIGClaim(t *testing.T, ns, name string) {
	t.Helper()
	class := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: uniqueName("lease-mig")},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
			Expression: `device.driver == "gpu.gpuaas.io" && device.attributes["gpu.gpuaas.io"].type == "mig"`}}}}}
	createObject(t, class)
	if err := createClaim(framework.Context(t, time.Minute), gpuClaim(ns, name, class.Name, 1)); err != nil {
		t.Fatal(err)
	}
}
