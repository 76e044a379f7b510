package kubeletsim

import (
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

func TestRunningStatus(t *testing.T) {
	scheduled := metav1.NewTime(time.Unix(100, 0))
	now := metav1.NewTime(time.Unix(200, 0))
	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{UID: "uid"},
		Spec: v1.PodSpec{
			InitContainers: []v1.Container{
				{Name: "setup", Image: "img"},
				{Name: "sidecar", Image: "img", RestartPolicy: ptr.To(v1.ContainerRestartPolicyAlways)},
			},
			Containers: []v1.Container{{Name: "main", Image: "img"}},
		},
		Status: v1.PodStatus{Phase: v1.PodPending, Conditions: []v1.PodCondition{
			{Type: v1.PodScheduled, Status: v1.ConditionTrue, LastTransitionTime: scheduled},
		}},
	}
	st := runningStatus(pod, now)

	if st.Phase != v1.PodRunning || st.StartTime == nil {
		t.Errorf("phase %s, start time %v; want Running with a start time", st.Phase, st.StartTime)
	}
	want := map[v1.PodConditionType]bool{v1.PodScheduled: true, v1.PodReadyToStartContainers: true,
		v1.PodInitialized: true, v1.ContainersReady: true, v1.PodReady: true}
	for _, c := range st.Conditions {
		if !want[c.Type] || c.Status != v1.ConditionTrue {
			t.Errorf("unexpected condition %+v", c)
		}
		delete(want, c.Type)
		if c.Type == v1.PodScheduled && !c.LastTransitionTime.Equal(&scheduled) {
			t.Error("PodScheduled condition changed")
		}
	}
	if len(want) > 0 {
		t.Errorf("missing conditions %v", want)
	}
	if st.InitContainerStatuses[0].State.Terminated == nil || st.InitContainerStatuses[1].State.Running == nil {
		t.Errorf("init containers %+v: want setup completed and the sidecar running", st.InitContainerStatuses)
	}
	if c := st.ContainerStatuses[0]; c.Name != "main" || !c.Ready || c.State.Running == nil {
		t.Errorf("container status %+v, want main running and ready", c)
	}
	if pod.Status.Phase != v1.PodPending {
		t.Error("runningStatus modified the pod")
	}
}
