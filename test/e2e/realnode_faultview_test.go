package e2e

import (
	"context"
	"maps"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

// faultView is how the real node shows a device fault on the suite's
// version: as taints on the faulty devices where the API server keeps
// device taints, or, where it drops them (1.34 and 1.35 with default
// gates), by not publishing those devices until the fault clears
// (inventory.TaintsFor): never as a device offered as if it were healthy.
type faultView struct{ taints bool }

func suiteFaultView(t *testing.T) faultView { return faultView{taints: suiteShape(t).taints} }

// waitFaulted waits until exactly devices show the fault key.
func (f faultView) waitFaulted(t *testing.T, ctx context.Context, key, what string, devices map[string]bool) time.Duration {
	t.Helper()
	if f.taints {
		return waitTaints(t, ctx, key, what, func(got map[string]bool) bool { return maps.Equal(got, devices) })
	}
	return waitPublished(t, ctx, what+" (withheld: taints are not kept here)", func(published map[string]bool) bool {
		for d := range devices {
			if published[d] {
				return false
			}
		}
		return len(published) > 0
	})
}

// waitCleared waits until no device shows the fault key any more; devices
// are the ones that showed it.
func (f faultView) waitCleared(t *testing.T, ctx context.Context, key, what string, devices map[string]bool) time.Duration {
	t.Helper()
	if f.taints {
		return waitTaints(t, ctx, key, what, func(got map[string]bool) bool { return len(got) == 0 })
	}
	return waitPublished(t, ctx, what+" (published again)", func(published map[string]bool) bool {
		for d := range devices {
			if !published[d] {
				return false
			}
		}
		return true
	})
}

// waitFaultyGPU waits until the node's GpuNode shows GPU index out of
// service with posture want, or, where taints are not kept, not listed at
// all: its devices are withheld, and the GpuNode names the missing feature.
func (f faultView) waitFaultyGPU(t *testing.T, ctx context.Context, index int32, want gpuaas.Posture) {
	t.Helper()
	if f.taints {
		waitGPUPosture(t, ctx, index, want)
		return
	}
	c := installCRDs(t)
	var node gpuaas.GpuNode
	listed := true
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		if err := c.Get(ctx, types.NamespacedName{Name: realNodeName}, &node); err != nil {
			return false, client.IgnoreNotFound(err)
		}
		listed = false
		for _, g := range node.Status.GPUs {
			listed = listed || g.Index == index
		}
		return !listed, nil
	})
	if err != nil {
		t.Fatalf("GPU %d of %s still listed on its GpuNode while its devices are withheld: %v", index, realNodeName, err)
	}
	t.Logf("GpuNode %s: GPU %d not listed while withheld; missing features %+v", realNodeName, index, node.Status.MissingFeatures)
}

// waitPublished waits until cond holds of the names of the node's
// published devices, and returns how long that took.
func waitPublished(t *testing.T, ctx context.Context, what string, cond func(published map[string]bool) bool) time.Duration {
	t.Helper()
	took, last, err := waitDevices(ctx, func([]string) bool { return true }, cond)
	if err != nil {
		t.Fatalf("waiting for %s: %v; %d devices published", what, err, len(last))
	}
	return took
}

// checkNoMIGOffered: where the API server cannot keep dynamic MIG apart
// from its whole GPU (no partitionable devices), the node offers no MIG
// device at all, and its GpuNode names the missing feature and its gate.
func checkNoMIGOffered(t *testing.T, ctx context.Context) {
	t.Helper()
	list, err := cp.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	published := 0
	for _, s := range list.Items {
		if s.Spec.Driver != framework.DriverName || s.Spec.Pool.Name != realNodeName {
			continue
		}
		for _, d := range s.Spec.Devices {
			published++
			if stringAttr(d, "type") == "mig" {
				t.Errorf("device %s is a MIG device, published where partitionable devices are off", d.Name)
			}
		}
	}
	checkGpuNodeNamesGaps(ctx, t, cp, realNodeName, suiteCase(t))
	t.Logf("no MIG device among the %d published; the GpuNode names the gap", published)
}
