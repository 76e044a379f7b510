package framework

import (
	"context"
	"fmt"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
)

// WaitForPod polls a pod until cond accepts it and returns it. On timeout
// the error describes the pod's last state, which is what one wants to read
// in a failed test.
func (cp *ControlPlane) WaitForPod(ctx context.Context, namespace, name, what string, cond func(*v1.Pod) bool) (*v1.Pod, error) {
	var pod *v1.Pod
	err := wait.PollUntilContextCancel(ctx, pollInterval, true, func(ctx context.Context) (bool, error) {
		p, err := cp.Client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		pod = p
		return cond(p), nil
	})
	if err != nil {
		return pod, fmt.Errorf("pod %s/%s not %s: %w; %s", namespace, name, what, err, cp.describePod(ctx, namespace, name, pod))
	}
	return pod, nil
}

// WaitForPodRunning waits until the pod is Running and Ready.
func (cp *ControlPlane) WaitForPodRunning(ctx context.Context, namespace, name string) (*v1.Pod, error) {
	return cp.WaitForPod(ctx, namespace, name, "running", func(p *v1.Pod) bool {
		return p.Status.Phase == v1.PodRunning && podCondition(p, v1.PodReady) == v1.ConditionTrue
	})
}

// WaitForPodUnschedulable waits until the scheduler gave up on the pod
// (PodScheduled=False, reason Unschedulable) with a message that contains
// every one of parts, and returns that message.
func (cp *ControlPlane) WaitForPodUnschedulable(ctx context.Context, namespace, name string, parts ...string) (string, error) {
	var msg string
	_, err := cp.WaitForPod(ctx, namespace, name, "unschedulable", func(p *v1.Pod) bool {
		for _, c := range p.Status.Conditions {
			if c.Type == v1.PodScheduled && c.Status == v1.ConditionFalse && c.Reason == v1.PodReasonUnschedulable {
				msg = c.Message
				return containsAll(msg, parts)
			}
		}
		return false
	})
	return msg, err
}

// WaitForPodGone waits until the pod no longer exists.
func (cp *ControlPlane) WaitForPodGone(ctx context.Context, namespace, name string) error {
	err := wait.PollUntilContextCancel(ctx, pollInterval, true, func(ctx context.Context) (bool, error) {
		_, err := cp.Client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, err
	})
	if err != nil {
		return fmt.Errorf("pod %s/%s not gone: %w; %s", namespace, name, err, cp.describePod(ctx, namespace, name, nil))
	}
	return nil
}

// WaitForClaimGone waits until the ResourceClaim no longer exists (a
// template's claim is deleted by the controller-manager after its pod).
func (cp *ControlPlane) WaitForClaimGone(ctx context.Context, namespace, name string) error {
	err := wait.PollUntilContextCancel(ctx, pollInterval, true, func(ctx context.Context) (bool, error) {
		_, err := cp.Client.ResourceV1().ResourceClaims(namespace).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, err
	})
	if err != nil {
		return fmt.Errorf("claim %s/%s not deleted: %w", namespace, name, err)
	}
	return nil
}

// WaitForNoPods waits until a namespace has no pods left.
func (cp *ControlPlane) WaitForNoPods(ctx context.Context, namespace string) error {
	var left []string
	err := wait.PollUntilContextCancel(ctx, pollInterval, true, func(ctx context.Context) (bool, error) {
		pods, err := cp.Client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		left = left[:0]
		for _, p := range pods.Items {
			left = append(left, p.Name)
		}
		return len(left) == 0, nil
	})
	if err != nil {
		return fmt.Errorf("pods of namespace %s not gone (%v): %w", namespace, left, err)
	}
	return nil
}

// WaitForEvent waits for an event about an object (by kind and name) with
// the given reason whose message contains every one of parts.
func (cp *ControlPlane) WaitForEvent(ctx context.Context, namespace, kind, name, reason string, parts ...string) (*v1.Event, error) {
	selector := fields.Set{"involvedObject.kind": kind, "involvedObject.name": name, "reason": reason}.AsSelector().String()
	var found *v1.Event
	var seen []string
	err := wait.PollUntilContextCancel(ctx, pollInterval, true, func(ctx context.Context) (bool, error) {
		events, err := cp.Client.CoreV1().Events(namespace).List(ctx, metav1.ListOptions{FieldSelector: selector})
		if err != nil {
			return false, err
		}
		seen = seen[:0]
		for i, e := range events.Items {
			seen = append(seen, e.Message)
			if containsAll(e.Message, parts) {
				found = &events.Items[i]
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		return nil, fmt.Errorf("no %s event for %s %s/%s containing %q (seen: %q): %w", reason, kind, namespace, name, parts, seen, err)
	}
	return found, nil
}

func containsAll(s string, parts []string) bool {
	for _, p := range parts {
		if !strings.Contains(s, p) {
			return false
		}
	}
	return true
}

func podCondition(p *v1.Pod, t v1.PodConditionType) v1.ConditionStatus {
	for _, c := range p.Status.Conditions {
		if c.Type == t {
			return c.Status
		}
	}
	return v1.ConditionUnknown
}

// describePod summarises a pod and its recent events for error messages.
func (cp *ControlPlane) describePod(ctx context.Context, namespace, name string, pod *v1.Pod) string {
	var b strings.Builder
	if pod != nil {
		fmt.Fprintf(&b, "phase=%s node=%q", pod.Status.Phase, pod.Spec.NodeName)
		for _, c := range pod.Status.Conditions {
			fmt.Fprintf(&b, " %s=%s", c.Type, c.Status)
			if c.Message != "" {
				fmt.Fprintf(&b, " (%s)", c.Message)
			}
		}
	}
	// ctx has usually expired: that is why the pod is described.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	selector := fields.Set{"involvedObject.kind": "Pod", "involvedObject.name": name}.AsSelector().String()
	events, err := cp.Client.CoreV1().Events(namespace).List(ctx, metav1.ListOptions{FieldSelector: selector})
	if err == nil {
		for _, e := range events.Items {
			fmt.Fprintf(&b, "; event %s %s: %s", e.Type, e.Reason, e.Message)
		}
	}
	return b.String()
}
