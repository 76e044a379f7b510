package e2e

import (
	"path/filepath"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

// ExpectAnnotation marks a demo object that must be refused:
// demo.gpuaas.io/expect: denied.
const (
	ExpectAnnotation = "demo.gpuaas.io/expect"
	ExpectDenied     = "denied"
)

// TestControllerDemoSpecs applies demo/specs/quota on an 8-GPU node with
// the controller running: the catalog gets its DeviceClasses, the pods
// run, the object marked as expected to be denied is refused with the
// documented reason, and the tenants' status shows the borrowing.
func TestControllerDemoSpecs(t *testing.T) {
	startNode(t)
	rc := startController(t)
	ctx := framework.Context(t, 4*time.Minute)
	files, err := framework.YAMLFiles(filepath.Join(repoRoot, "demo", "specs", "quota"))
	if err != nil {
		t.Fatal(err)
	}
	var pods []*unstructured.Unstructured
	for _, file := range files {
		objs, err := framework.ReadObjects(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, obj := range objs {
			pods = append(pods, applyDemoObject(t, obj)...)
		}
	}
	for _, p := range pods {
		runningPod(t, ctx, p.GetNamespace(), p.GetName())
	}
	waitForProfile(t, "mig-1g", "counting the allocated slice", func(p *gpuaas.GpuProfile) bool {
		return p.Status.MatchingDevices > 0 && p.Status.AllocatedDevices == 1
	})
	waitForProfile(t, "h100", "matching the node's whole GPUs", func(p *gpuaas.GpuProfile) bool { return p.Status.MatchingDevices > 0 })
	waitForProfile(t, "shared-4way", "matching the time-slice replicas", func(p *gpuaas.GpuProfile) bool { return p.Status.MatchingDevices == 4 })
	q := waitForQuota(t, "team-a", "charged 1/7 used, 2/7 reserved", func(q *gpuaas.TenantQuota) bool {
		return usedUnits(q) == "143m" && q.Status.Reserved.GpuUnits.String() == "286m"
	})
	if b := q.Status.Borrowed.GpuUnits.String(); b != "129m" { // 3/7 - 0.3 = 9/70
		t.Errorf("team-a borrowed %s, want 129m", b)
	}
	// burst asked for an H100 or else a 1g; team-a may have no H100.
	burst, err := cp.Client.ResourceV1().ResourceClaims("team-a").Get(ctx, "burst", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if alts := burst.Spec.Devices.Requests[0].FirstAvailable; len(alts) != 1 || alts[0].DeviceClassName != "mig-1g" {
		t.Errorf("claim burst stored with alternatives %+v, want the 1g alone", alts)
	}
	waitForQuota(t, "team-b", "charged its notebook", func(q *gpuaas.TenantQuota) bool { return q.Status.ClaimsCounted == 1 })
	rc.alive(t)
}

// applyDemoObject applies one object; one marked denied must be refused.
// It cleans up what it created and returns it if it is a pod.
func applyDemoObject(t *testing.T, obj *unstructured.Unstructured) []*unstructured.Unstructured {
	t.Helper()
	ctx := framework.Context(t, time.Minute)
	if obj.GetAnnotations()[ExpectAnnotation] == ExpectDenied {
		_, err := cp.ApplyObject(ctx, obj, "")
		mustDeny(t, err, "exceeded")
		return nil
	}
	out, err := cp.ApplyObject(ctx, obj, "")
	if err != nil {
		t.Fatal(err)
	}
	switch out.GetKind() {
	case "Namespace":
		cp.DeleteNamespaceAtCleanup(t, out.GetName())
	case gpuaas.GpuProfileKind:
		deleteAtCleanup(t, out)
		waitForProfileReady(t, out.GetName())
	case gpuaas.TenantQuotaKind:
		// As `make demo` should: claims come after the controller has
		// seen the quota that charges them.
		deleteAtCleanup(t, out)
		waitForQuota(t, out.GetName(), "observed", func(q *gpuaas.TenantQuota) bool {
			return q.Status.ObservedGeneration == q.Generation
		})
	case "Pod":
		return []*unstructured.Unstructured{out}
	}
	return nil
}
