package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

// applySharingClasses applies the DeviceClasses of the sharing scenarios
// (server-side apply, so applying them again is harmless).
func applySharingClasses(t *testing.T, ctx context.Context) {
	t.Helper()
	if _, err := cp.Apply(ctx, filepath.Join(repoRoot, "demo", "specs", "sharing", "00-classes"), ""); err != nil {
		t.Fatalf("applying the sharing classes: %v", err)
	}
}

// TestTimeSlicedGPUWithRealScheduler: GPU 4 of the demo node is time-sliced
// four ways. Pinned to it, four single-replica pods run, each on its own
// replica of the same GPU, and the fifth stays Pending.
func TestTimeSlicedGPUWithRealScheduler(t *testing.T) {
	node := startNode(t)
	ctx := framework.Context(t, 3*time.Minute)
	applySharingClasses(t, ctx)
	ns := cp.CreateNamespace(t, "timeslice")
	onGPU4 := `device.attributes["gpu.gpuaas.io"].type == "timeslice" && device.attributes["gpu.gpuaas.io"].index == 4`
	seen := map[string]bool{}
	for i := range 4 {
		name := fmt.Sprintf("replica-%d", i)
		createSelectedPod(t, ctx, ns, name, "timeslice.gpuaas.io", onGPU4)
		pod := runningPod(t, ctx, ns, name)
		claim := onlyClaim(t, ctx, pod)
		checkPrepared(t, node, pod, claim)
		dev := claim.Status.Allocation.Devices.Results[0].Device
		if !strings.HasPrefix(dev, "gpu-4-ts-") || seen[dev] {
			t.Errorf("pod %s got %s (seen %v)", name, dev, seen)
		}
		seen[dev] = true
	}
	createSelectedPod(t, ctx, ns, "fifth", "timeslice.gpuaas.io", onGPU4)
	if _, err := cp.WaitForPodUnschedulable(ctx, ns, "fifth"); err != nil {
		t.Fatalf("a fifth replica was allocated on a 4-way GPU: %v", err)
	}
	deletePod(t, ctx, ns, "replica-0")
	fifth := runningPod(t, ctx, ns, "fifth")
	checkPrepared(t, node, fifth, onlyClaim(t, ctx, fifth))
}

// TestMemorySharesNeverOvercommit: GPU 5 is shared with 80Gi of memory.
// Shares of 30Gi: two fit (60Gi), a third (90Gi) is never allocated while
// they hold theirs; each gets its own share ID on the one device.
func TestMemorySharesNeverOvercommit(t *testing.T) {
	node := startNode(t)
	ctx := framework.Context(t, 3*time.Minute)
	applySharingClasses(t, ctx)
	ns := cp.CreateNamespace(t, "shares")
	shareIDs := map[string]bool{}
	for _, name := range []string{"share-a", "share-b"} {
		createSharePod(t, ctx, ns, name, "30Gi")
		pod := runningPod(t, ctx, ns, name)
		claim := onlyClaim(t, ctx, pod)
		checkPrepared(t, node, pod, claim)
		r := claim.Status.Allocation.Devices.Results[0]
		if r.Device != "gpu-5-shared" || r.ShareID == nil || shareIDs[string(*r.ShareID)] {
			t.Errorf("pod %s: device %s share %v", name, r.Device, r.ShareID)
		} else {
			shareIDs[string(*r.ShareID)] = true
		}
		if got := r.ConsumedCapacity["memory"]; got.String() != "30Gi" {
			t.Errorf("pod %s consumed %s, want 30Gi", name, got.String())
		}
	}
	createSharePod(t, ctx, ns, "share-c", "30Gi")
	if _, err := cp.WaitForPodUnschedulable(ctx, ns, "share-c"); err != nil {
		t.Fatalf("shares past the GPU's 80Gi were allocated: %v", err)
	}
	deletePod(t, ctx, ns, "share-a")
	c := runningPod(t, ctx, ns, "share-c")
	checkPrepared(t, node, c, onlyClaim(t, ctx, c))
}

// createSharePod creates a pod whose claim asks for a memory share.
func createSharePod(t *testing.T, ctx context.Context, namespace, name, memory string) {
	t.Helper()
	tmpl := templateFor(name, namespace, "shared.gpuaas.io")
	tmpl.Spec.Spec.Devices.Requests[0].Exactly.Capacity = &resourceapi.CapacityRequirements{
		Requests: map[resourceapi.QualifiedName]resource.Quantity{"memory": resource.MustParse(memory)},
	}
	createTemplatePod(t, ctx, tmpl)
}
