package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

// TestDynamicMIGCountersWithRealScheduler checks, with the real
// kube-scheduler's allocator, what the counters promise on a dynamic-MIG GPU
// (GPU 7 of the demo node): a whole-GPU allocation blocks every MIG device of
// that GPU, and two overlapping MIG devices are never both allocated.
func TestDynamicMIGCountersWithRealScheduler(t *testing.T) {
	node := startNode(t)
	ctx := framework.Context(t, 3*time.Minute)
	ns := cp.CreateNamespace(t, "mig")
	onGPU7 := `device.attributes["gpu.gpuaas.io"].index == 7`

	createSelectedPod(t, ctx, ns, "whole", "gpu.gpuaas.io", onGPU7)
	whole := runningPod(t, ctx, ns, "whole")
	checkPrepared(t, node, whole, onlyClaim(t, ctx, whole))
	createSelectedPod(t, ctx, ns, "small", "mig.gpuaas.io", onGPU7+` && device.attributes["gpu.gpuaas.io"].profile == "1g.10gb"`)
	if _, err := cp.WaitForPodUnschedulable(ctx, ns, "small"); err != nil {
		t.Fatalf("MIG device allocated next to the whole GPU: %v", err)
	}
	deletePod(t, ctx, ns, "whole")
	small := runningPod(t, ctx, ns, "small")
	if dev := onlyClaim(t, ctx, small).Status.Allocation.Devices.Results[0].Device; !strings.HasPrefix(dev, "gpu-7-mig-1g10gb-") {
		t.Errorf("small got %s", dev)
	}

	// The full-size MIG device overlaps every placement, including small's.
	createSelectedPod(t, ctx, ns, "full", "mig.gpuaas.io", onGPU7+` && device.attributes["gpu.gpuaas.io"].computeSlices == 7`)
	if _, err := cp.WaitForPodUnschedulable(ctx, ns, "full"); err != nil {
		t.Fatalf("overlapping MIG devices both allocated: %v", err)
	}
	deletePod(t, ctx, ns, "small")
	full := runningPod(t, ctx, ns, "full")
	checkPrepared(t, node, full, onlyClaim(t, ctx, full))
}

func deletePod(t testing.TB, ctx context.Context, ns, name string) {
	t.Helper()
	if err := cp.Client.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := cp.WaitForPodGone(ctx, ns, name); err != nil {
		t.Fatal(err)
	}
}

// createSelectedPod creates a pod with a claim template asking for one
// device of class that matches the CEL selector.
func createSelectedPod(t *testing.T, ctx context.Context, namespace, name, class, cel string) {
	t.Helper()
	tmpl := templateFor(name, namespace, class)
	tmpl.Spec.Spec.Devices.Requests[0].Exactly.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: cel}}}
	createTemplatePod(t, ctx, tmpl)
}

// templateFor is a claim template asking for one device of a class.
func templateFor(name, namespace, class string) *resourceapi.ResourceClaimTemplate {
	return &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: class}}},
		}}},
	}
}
