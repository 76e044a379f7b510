package kubeletsim

import (
	"fmt"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// runningStatus is the status the kubelet would report once all containers
// of pod started and passed readiness: phase Running, the readiness
// conditions True, init containers completed, containers running. The
// scheduler's PodScheduled condition is kept.
func runningStatus(pod *v1.Pod, now metav1.Time) v1.PodStatus {
	st := *pod.Status.DeepCopy()
	st.Phase = v1.PodRunning
	st.HostIP = "127.0.0.1"
	st.HostIPs = []v1.HostIP{{IP: "127.0.0.1"}}
	if st.StartTime == nil {
		st.StartTime = &now
	}
	for _, t := range []v1.PodConditionType{v1.PodReadyToStartContainers, v1.PodInitialized, v1.ContainersReady, v1.PodReady} {
		setCondition(&st, v1.PodCondition{Type: t, Status: v1.ConditionTrue, LastTransitionTime: now})
	}
	st.InitContainerStatuses = nil
	for _, c := range pod.Spec.InitContainers {
		st.InitContainerStatuses = append(st.InitContainerStatuses, initContainerStatus(pod, c, now))
	}
	st.ContainerStatuses = nil
	for _, c := range pod.Spec.Containers {
		st.ContainerStatuses = append(st.ContainerStatuses, runningContainer(pod, c, now))
	}
	return st
}

func runningContainer(pod *v1.Pod, c v1.Container, now metav1.Time) v1.ContainerStatus {
	return v1.ContainerStatus{
		Name:        c.Name,
		Image:       c.Image,
		ImageID:     c.Image,
		ContainerID: fmt.Sprintf("kubeletsim://%s-%s", pod.UID, c.Name),
		Ready:       true,
		Started:     ptr.To(true),
		State:       v1.ContainerState{Running: &v1.ContainerStateRunning{StartedAt: now}},
	}
}

// initContainerStatus: a sidecar (restartPolicy Always) keeps running, a
// plain init container has completed.
func initContainerStatus(pod *v1.Pod, c v1.Container, now metav1.Time) v1.ContainerStatus {
	st := runningContainer(pod, c, now)
	if c.RestartPolicy != nil && *c.RestartPolicy == v1.ContainerRestartPolicyAlways {
		return st
	}
	st.Ready, st.Started = false, ptr.To(false)
	st.State = v1.ContainerState{Terminated: &v1.ContainerStateTerminated{
		ExitCode: 0, Reason: "Completed", StartedAt: now, FinishedAt: now,
		ContainerID: st.ContainerID,
	}}
	return st
}

// setCondition replaces the condition of the same type or appends it,
// keeping the transition time when the status does not change.
func setCondition(st *v1.PodStatus, c v1.PodCondition) {
	for i := range st.Conditions {
		if st.Conditions[i].Type != c.Type {
			continue
		}
		if st.Conditions[i].Status == c.Status {
			c.LastTransitionTime = st.Conditions[i].LastTransitionTime
		}
		st.Conditions[i] = c
		return
	}
	st.Conditions = append(st.Conditions, c)
}
