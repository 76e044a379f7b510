package e2e

import (
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
	"github.com/gpuaas/gpu-dra-driver/test/kubeletsim"
)

// TestPendingUntilGPUsFreed: a pod asking for more GPUs than the node has
// free stays Pending with the scheduler's reason, and runs once another pod
// gives its GPUs back. A pod asking for more GPUs than the node has at all
// never schedules.
func TestPendingUntilGPUsFreed(t *testing.T) {
	node := startNode(t)
	ctx := framework.Context(t, 3*time.Minute)
	ns := cp.CreateNamespace(t, "pending")

	createGPUPod(t, ctx, ns, "holder", 6, nil)
	holder := runningPod(t, ctx, ns, "holder")
	holderClaim := onlyClaim(t, ctx, holder)

	createGPUPod(t, ctx, ns, "waiter", 4, nil)
	createGPUPod(t, ctx, ns, "too-big", 9, nil)
	for _, name := range []string{"waiter", "too-big"} {
		msg, err := cp.WaitForPodUnschedulable(ctx, ns, name, "cannot allocate all claims")
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: %s", name, msg)
	}
	if _, err := cp.WaitForEvent(ctx, ns, "Pod", "waiter", "FailedScheduling", "cannot allocate all claims"); err != nil {
		t.Error(err)
	}

	if err := cp.Client.CoreV1().Pods(ns).Delete(ctx, "holder", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := cp.WaitForPodGone(ctx, ns, "holder"); err != nil {
		t.Fatal(err)
	}
	checkUnprepared(t, node, holderClaim)
	waiter := runningPod(t, ctx, ns, "waiter")
	checkPrepared(t, node, waiter, onlyClaim(t, ctx, waiter))

	if _, err := cp.WaitForPodUnschedulable(ctx, ns, "too-big"); err != nil {
		t.Errorf("pod asking for 9 of 8 GPUs: %v", err)
	}
}

// TestDeleteUnpreparesClaim: a graceful delete goes through the node, which
// unprepares the claim (CDI spec and checkpoint entry removed) before the
// pod disappears; the generated claim is then deleted.
func TestDeleteUnpreparesClaim(t *testing.T) {
	node := startNode(t)
	ctx := framework.Context(t, 3*time.Minute)
	ns := cp.CreateNamespace(t, "delete")

	createGPUPod(t, ctx, ns, "pod", 1, nil)
	pod := runningPod(t, ctx, ns, "pod")
	claim := onlyClaim(t, ctx, pod)
	checkPrepared(t, node, pod, claim)

	if err := cp.Client.CoreV1().Pods(ns).Delete(ctx, "pod", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := cp.WaitForPodGone(ctx, ns, "pod"); err != nil {
		t.Fatal(err)
	}
	checkUnprepared(t, node, claim)
	if err := cp.WaitForClaimGone(ctx, ns, claim.Name); err != nil {
		t.Error(err)
	}
}

// TestPluginRestart: a restarted plugin re-registers, keeps the claims it
// prepared (files and checkpoint), prepares new ones and can still
// unprepare the old ones from its checkpoint.
func TestPluginRestart(t *testing.T) {
	node := startNode(t)
	ctx := framework.Context(t, 3*time.Minute)
	ns := cp.CreateNamespace(t, "restart")

	createGPUPod(t, ctx, ns, "before", 1, nil)
	before := runningPod(t, ctx, ns, "before")
	beforeClaim := onlyClaim(t, ctx, before)

	if err := node.RestartPlugin(ctx); err != nil {
		t.Fatal(err)
	}
	checkPrepared(t, node, before, beforeClaim)

	createGPUPod(t, ctx, ns, "after", 1, nil)
	after := runningPod(t, ctx, ns, "after")
	checkPrepared(t, node, after, onlyClaim(t, ctx, after))

	if err := cp.Client.CoreV1().Pods(ns).Delete(ctx, "before", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := cp.WaitForPodGone(ctx, ns, "before"); err != nil {
		t.Fatal(err)
	}
	checkUnprepared(t, node, beforeClaim)
}

// TestBadOpaqueConfig: an unknown field in the claim's GpuConfig fails the
// prepare; the pod shows the kubelet's FailedPrepareDynamicResources event
// with the plugin's error, which names the field, and does not run.
func TestBadOpaqueConfig(t *testing.T) {
	node := startNode(t)
	ctx := framework.Context(t, 3*time.Minute)
	ns := cp.CreateNamespace(t, "badconfig")

	createGPUPod(t, ctx, ns, "pod", 1, map[string]any{
		"apiVersion": "gpu.gpuaas.io/v1alpha1",
		"kind":       "GpuConfig",
		"sharingg":   map[string]any{"strategy": "Exclusive"},
	})
	ev, err := cp.WaitForEvent(ctx, ns, "Pod", "pod", kubeletsim.ReasonFailedPrepare, "sharingg")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("event: %s", ev.Message)
	if ev.Type != v1.EventTypeWarning {
		t.Errorf("event type %s, want Warning", ev.Type)
	}
	pod, err := cp.Client.CoreV1().Pods(ns).Get(ctx, "pod", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pod.Status.Phase == v1.PodRunning {
		t.Error("pod with a bad config is running")
	}
	claim := onlyClaim(t, ctx, pod)

	// A pod that never started can still be deleted: the node calls
	// NodeUnprepareResources for the claim it tried, which must succeed.
	if err := cp.Client.CoreV1().Pods(ns).Delete(ctx, "pod", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := cp.WaitForPodGone(ctx, ns, "pod"); err != nil {
		t.Fatal(err)
	}
	checkUnprepared(t, node, claim)
}
