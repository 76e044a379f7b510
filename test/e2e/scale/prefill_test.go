package scale

import (
	"context"
	"fmt"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

// prefillWholeGPUs takes GPUs 0..gpus-1 of every node before a mode is
// measured, as running workloads would, without asking the scheduler: a
// pod bound to the node by name and a claim allocated to those whole GPUs
// and reserved for it, written through the API as the scheduler would
// write them. (Scheduling 4-GPU claims on 500 dynamic MIG nodes took
// longer than the mode itself: 491 of 500 in 6 minutes.)
func (r *runner) prefillWholeGPUs(tb testing.TB, ns string, gpus int) {
	ctx := framework.Context(tb, 10*time.Minute)
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(16)
	for _, node := range r.fleet.Names() {
		g.Go(func() error { return prefillNode(gctx, r, ns, node, gpus) })
	}
	if err := g.Wait(); err != nil {
		tb.Fatal(err)
	}
}

func prefillNode(ctx context.Context, r *runner, ns, node string, gpus int) error {
	req := resourceapi.DeviceRequest{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu.gpuaas.io",
		AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: int64(gpus)}}
	devices := make([]string, 0, gpus)
	for g := range gpus {
		devices = append(devices, fmt.Sprintf("gpu-%d", g))
	}
	return createAllocatedPod(ctx, r.client, ns, "prefill-"+node, node, req, devices)
}

// createAllocatedPod makes a pod bound to node whose claim (one request,
// req) holds devices of the node's pool, allocated through the API as the
// scheduler would have written it: a node already in use, without
// scheduling anything.
func createAllocatedPod(ctx context.Context, client kubernetes.Interface, ns, name, node string, req resourceapi.DeviceRequest, devices []string) error {
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec:       resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{req}}},
	}
	claim, err := client.ResourceV1().ResourceClaims(ns).Create(ctx, claim, createOpts)
	if err != nil {
		return fmt.Errorf("creating claim %s: %w", name, err)
	}
	pod := podFor(ns, name, "", 0, 0)
	pod.Spec.NodeName = node
	pod.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: req.Name}}
	pod.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: req.Name, ResourceClaimName: &claim.Name}}
	if pod, err = client.CoreV1().Pods(ns).Create(ctx, pod, createOpts); err != nil {
		return fmt.Errorf("creating pod %s: %w", name, err)
	}
	claim.Status.Allocation = &resourceapi.AllocationResult{NodeSelector: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
		MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{node}}},
	}}}}
	for _, d := range devices {
		claim.Status.Allocation.Devices.Results = append(claim.Status.Allocation.Devices.Results, resourceapi.DeviceRequestAllocationResult{
			Request: req.Name, Driver: configapi.DriverName, Pool: node, Device: d})
	}
	claim.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: pod.Name, UID: pod.UID}}
	if _, err := client.ResourceV1().ResourceClaims(ns).UpdateStatus(ctx, claim, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("allocating claim %s: %w", name, err)
	}
	return nil
}
