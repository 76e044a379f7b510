package main

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/hardwareprofile"
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
