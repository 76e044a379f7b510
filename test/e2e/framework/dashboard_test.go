package framework

import (
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/hardwareprofile"
)

// TestDashboardJobTakesTheProfilesDefaultsAndQueue: the job the
// dashboard's admission would start from a rendered HardwareProfile asks
// each identifier's default in requests and limits (cpu 2, memory 8Gi, the
// profile's extended resource 1), carries the queue and priority labels
// of a Queue profile, and names the profile.
func TestDashboardJobTakesTheProfilesDefaultsAndQueue(t *testing.T) {
	p := &gpuaas.GpuProfile{ObjectMeta: metav1.ObjectMeta{Name: "shared-4way"}, Spec: gpuaas.GpuProfileSpec{
		Selector: gpuaas.ProfileSelector{Type: gpuaas.DeviceTypeTimeSlice}, ExtendedResourceName: ptr.To("gpuaas.io/shared-gpu"),
	}}
	hp, err := hardwareprofile.RenderIn(p, "team-a", hardwareprofile.Scheduling{LocalQueue: "gpus", PriorityClass: "interactive"})
	if err != nil {
		t.Fatal(err)
	}
	job, err := DashboardJob("team-a", "notebook", "pause", hp)
	if err != nil {
		t.Fatal(err)
	}
	c := job.Spec.Template.Spec.Containers[0]
	want := v1.ResourceList{"cpu": resource.MustParse("2"), "memory": resource.MustParse("8Gi"), "gpuaas.io/shared-gpu": resource.MustParse("1")}
	for name, q := range want {
		if got := c.Resources.Requests[name]; got.Cmp(q) != 0 {
			t.Errorf("requests[%s] = %s, want %s", name, got.String(), q.String())
		}
		if got := c.Resources.Limits[name]; got.Cmp(q) != 0 {
			t.Errorf("limits[%s] = %s, want %s", name, got.String(), q.String())
		}
	}
	if len(c.Resources.Requests) != len(want) {
		t.Errorf("requests %v, want only %v", c.Resources.Requests, want)
	}
	if job.Labels["kueue.x-k8s.io/queue-name"] != "gpus" || job.Labels["kueue.x-k8s.io/priority-class"] != "interactive" {
		t.Errorf("labels %v, want the queue gpus and the priority class interactive", job.Labels)
	}
	if job.Annotations[HardwareProfileNameAnnotation] != "shared-4way" || job.Annotations[HardwareProfileNamespaceAnnotation] != "team-a" {
		t.Errorf("annotations %v, want the profile named", job.Annotations)
	}

	node, err := hardwareprofile.RenderIn(p, "team-b", hardwareprofile.Scheduling{})
	if err != nil {
		t.Fatal(err)
	}
	job, err = DashboardJob("team-b", "notebook", "pause", node)
	if err != nil {
		t.Fatal(err)
	}
	if _, queued := job.Labels["kueue.x-k8s.io/queue-name"]; queued {
		t.Errorf("a Node profile's job has the queue label: %v", job.Labels)
	}
}
