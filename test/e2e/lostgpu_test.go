package e2e

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/inventory"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev/nvmock"
	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

// TestLostGPUDoesNotTakeTheNodeDown (issue 25 item 1): a GPU falls off the
// bus under a running pod and the plugin restarts (a crash, an update).
// The plugin used to exit at enumeration ("error getting device handle for
// index '3': ERROR_GPU_IS_LOST"), publish nothing and never unprepare the
// pod's claim. Now it publishes the seven other GPUs, says on the Node
// which one it could not read, and unprepares the claim when the pod goes.
func TestLostGPUDoesNotTakeTheNodeDown(t *testing.T) {
	ctx := framework.Context(t, 4*time.Minute)
	node := startNodeWith(t, framework.NodeOptions{Name: nodeName(t)}) // eight whole GPUs
	stateDir := filepath.Join(node.PluginDataDir, "mock-nvml")
	ns := cp.CreateNamespace(t, "lost-gpu")
	createSelectedPod(t, ctx, ns, "on3", "gpu.gpuaas.io", `device.attributes["gpu.gpuaas.io"].index == 3`)
	pod := runningPod(t, ctx, ns, "on3")
	claim := onlyClaim(t, ctx, pod)
	checkPrepared(t, node, pod, claim)

	if err := nvmock.SetGPULost(stateDir, "3", true); err != nil {
		t.Fatal(err)
	}
	if err := node.RestartPlugin(ctx); err != nil {
		t.Fatalf("the plugin did not come back with GPU 3 lost: %v", err)
	}
	var published []string
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		slices, err := node.ResourceSlices(ctx)
		if err != nil {
			return false, err
		}
		published = nil
		for _, s := range slices {
			for _, d := range s.Spec.Devices {
				published = append(published, d.Name)
			}
		}
		return len(published) == 7, nil
	})
	if err != nil {
		t.Fatalf("published %v, want the 7 GPUs other than GPU 3: %v", published, err)
	}
	for _, name := range published {
		if name == claim.Status.Allocation.Devices.Results[0].Device {
			t.Errorf("the lost GPU's device %s is published", name)
		}
	}
	var notes []string
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		events, err := cp.Client.EventsV1().Events(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		notes = nil
		for _, e := range events.Items {
			if e.Regarding.Kind == "Node" && e.Regarding.Name == node.Name && e.Reason == inventory.ReasonGPUNotPublished {
				notes = append(notes, e.Note)
			}
		}
		return len(notes) > 0, nil
	})
	if err != nil || !strings.Contains(notes[0], "GPU 3 cannot be read") || !strings.Contains(notes[0], "GPU_IS_LOST") {
		t.Errorf("Node events %s: %v, want one saying GPU 3 cannot be read (GPU_IS_LOST)", inventory.ReasonGPUNotPublished, notes)
	}

	deletePod(t, ctx, ns, "on3")
	checkUnprepared(t, node, claim)
}
