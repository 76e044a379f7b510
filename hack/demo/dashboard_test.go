package main

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/hardwareprofile"
	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

// TestHardwareProfileTable: the demo prints each published HardwareProfile
// with where it is, its display name, its scheduling (the LocalQueue of a
// Queue profile) and what a workload started with it asks (a shape's
// template), sorted by namespace.
func TestHardwareProfileTable(t *testing.T) {
	p := &gpuaas.GpuProfile{ObjectMeta: metav1.ObjectMeta{Name: "shared-4way"}, Spec: gpuaas.GpuProfileSpec{
		DisplayName: "Shared GPU, 4-way", Selector: gpuaas.ProfileSelector{Type: gpuaas.DeviceTypeTimeSlice},
		ExtendedResourceName: ptr.To("gpuaas.io/shared-gpu"),
	}}
	queued, err := hardwareprofile.RenderIn(p, "notebooks", hardwareprofile.Scheduling{LocalQueue: "gpus"})
	if err != nil {
		t.Fatal(err)
	}
	s := &gpuaas.GpuShape{ObjectMeta: metav1.ObjectMeta{Name: "gpu-slot"}, Spec: gpuaas.GpuShapeSpec{DisplayName: "GPU and NIC"}}
	shape, err := hardwareprofile.RenderShape(s, "team-a", hardwareprofile.Scheduling{})
	if err != nil {
		t.Fatal(err)
	}
	got := hardwareProfileTable([]unstructured.Unstructured{*queued, *shape})
	lines := strings.Split(strings.TrimSpace(got), "\n")
	if len(lines) != 3 {
		t.Fatalf("table:\n%s\nwant a header and two rows", got)
	}
	for i, want := range [][]string{
		{"NAMESPACE", "SCHEDULING", "ASKS"},
		{"notebooks", "shared-4way", "Shared GPU, 4-way", "Queue (gpus)", "cpu 2, memory 8Gi, gpuaas.io/shared-gpu 1"},
		{"team-a", "gpu-slot", "GPU and NIC", "Node", "cpu 2, memory 8Gi, template gpu-slot"},
	} {
		for _, w := range want {
			if !strings.Contains(lines[i], w) {
				t.Errorf("line %d %q lacks %q", i, lines[i], w)
			}
		}
	}
}

// TestDashboardTenantIsKueueManaged: what dashboardStep waits for holds in
// its files: demo/queueing/30-dashboard.yaml makes dashboardNamespace a
// Kueue-managed tenant (spec.kueue) with the LocalQueue dashboardQueue of
// its ClusterQueue, so the controller publishes Queue HardwareProfiles
// there; and the catalog's dashboardProfile renders one with an
// Accelerator identifier (its extended resource) and CPU and memory
// defaults small enough for the demo's node.
func TestDashboardTenantIsKueueManaged(t *testing.T) {
	root := filepath.Join("..", "..")
	objs, err := framework.ReadObjects(filepath.Join(root, "demo", "queueing", "30-dashboard.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var q gpuaas.TenantQuota
	queues := map[string]string{}
	for _, o := range objs {
		switch o.GetKind() {
		case "TenantQuota":
			if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(o.Object, &q, true); err != nil {
				t.Fatalf("TenantQuota: %v", err)
			}
		case "LocalQueue":
			cq, _, _ := unstructured.NestedString(o.Object, "spec", "clusterQueue")
			queues[o.GetNamespace()+"/"+o.GetName()] = cq
		}
	}
	if q.Spec.Kueue == nil || !slices.Contains(q.Spec.Namespaces, dashboardNamespace) {
		t.Fatalf("TenantQuota %+v: want Kueue-managed over %s", q.Spec, dashboardNamespace)
	}
	if got := queues[dashboardNamespace+"/"+dashboardQueue]; got != q.Spec.Kueue.ClusterQueue {
		t.Errorf("LocalQueue %s/%s points at %q, want the tenant's ClusterQueue %q", dashboardNamespace, dashboardQueue, got, q.Spec.Kueue.ClusterQueue)
	}

	catalog, err := framework.ReadObjects(filepath.Join(root, "demo", "specs", "quota", "00-profiles.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	found := profilesFor([]string{dashboardProfile}, catalog)
	if len(found) != 1 {
		t.Fatalf("the catalog has no GpuProfile %s", dashboardProfile)
	}
	var p gpuaas.GpuProfile
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(found[0].Object, &p, true); err != nil {
		t.Fatal(err)
	}
	hp, err := hardwareprofile.RenderIn(&p, dashboardNamespace, hardwareprofile.Scheduling{LocalQueue: dashboardQueue})
	if err != nil {
		t.Fatal(err)
	}
	job, err := framework.DashboardJob(dashboardNamespace, "notebook", "pause", hp)
	if err != nil {
		t.Fatal(err)
	}
	asks := job.Spec.Template.Spec.Containers[0].Resources.Requests
	if _, ok := asks[corev1.ResourceName(ptr.Deref(p.Spec.ExtendedResourceName, ""))]; !ok || p.Spec.ExtendedResourceName == nil {
		t.Errorf("the notebook asks %v, want the profile's extended resource", asks)
	}
	if cpu, mem := asks[corev1.ResourceCPU], asks[corev1.ResourceMemory]; cpu.Cmp(resource.MustParse("500m")) > 0 || mem.Cmp(resource.MustParse("1Gi")) > 0 {
		t.Errorf("the notebook asks cpu %s and memory %s; the demo's node may not fit them", cpu.String(), mem.String())
	}
}
