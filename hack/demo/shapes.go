package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/dynamic-resource-allocation/resourceclaim"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

// shapeFiles are the files of demo/shapes the scenario applies, in order:
// the NUMA pair first, so that the whole-node lease then meets a node that
// is partly used, and the GPU + NIC slot a node with no NIC driver. Both
// of those are whenUnavailable: Refuse, so their pods' claims are refused
// at once, with the count that says why.
var shapeFiles = []string{"numa-pair.yaml", "whole-node-lease.yaml", "gpu-nic-slot.yaml"}

// shapePodWait bounds how long the scenario waits for a shape's pod to
// run or be refused.
const shapePodWait = 2 * time.Minute

// shapesScenario applies demo/shapes on the demo's node and prints, per
// shape, its placeable count before its pod and what became of the pod:
// running on its devices (with their NUMA node), refused by the quota
// webhook (ShapeUnavailable), or waiting. The specs' pods are deleted
// first, as for the queueing scenario, so that whole GPUs are free; the
// shapes' pods are deleted at the end, so that queueing finds them free.
func (d *demo) shapesScenario(ctx context.Context, objs []*unstructured.Unstructured) error {
	if err := d.freeSpecGPUs(ctx, objs, "Shapes", "the shapes count what is left"); err != nil {
		return err
	}
	root, err := framework.RepoRoot()
	if err != nil {
		return err
	}
	c, err := d.client()
	if err != nil {
		return err
	}
	d.out.printf("\nShapes (demo/shapes): what a GPU service sells as one thing, rendered into a ResourceClaimTemplate per tenant:\n")
	var namespaces []string
	for _, file := range shapeFiles {
		ns, err := d.applyShape(ctx, c, filepath.Join(root, "demo", "shapes", file))
		if err != nil {
			return err
		}
		namespaces = append(namespaces, ns...)
	}
	return d.deletePodsIn(ctx, namespaces)
}

// applyShape applies one file of demo/shapes: everything but its pods,
// then, once the controller has rendered the shape's templates, its pods;
// and reports the shape and each pod. It returns the pods' namespaces.
func (d *demo) applyShape(ctx context.Context, c client.Client, file string) ([]string, error) {
	objs, err := framework.ReadObjects(file)
	if err != nil {
		return nil, err
	}
	var pods, rest []*unstructured.Unstructured
	var shapes []string
	for _, o := range objs {
		switch o.GetKind() {
		case "Pod":
			pods = append(pods, o)
		case "GpuShape":
			shapes = append(shapes, o.GetName())
			rest = append(rest, o)
		default:
			rest = append(rest, o)
		}
	}
	if _, _, err := d.cp.ApplyObjects(ctx, file, rest, "default"); err != nil {
		return nil, err
	}
	before := map[string]int32{}
	for _, name := range shapes {
		s, err := waitShape(ctx, c, name, time.Minute, func(s *gpuaas.GpuShape) bool {
			return s.Status.ObservedGeneration == s.Generation && s.Status.Templates > 0
		})
		if err != nil {
			return nil, err
		}
		before[name] = s.Status.Placeable
		d.out.printf("\n  %s (%s, %s): placeable %d: %s\n", s.Name, s.Spec.DisplayName,
			s.Spec.WhenUnavailable, s.Status.Placeable, s.Status.PlaceableMessage)
	}
	if d.real != nil {
		if err := useWorkload(pods); err != nil {
			return nil, err
		}
	}
	if _, _, err := d.cp.ApplyObjects(ctx, file, pods, "default"); err != nil {
		return nil, err
	}
	var namespaces []string
	ran := false
	for _, p := range pods {
		namespaces = append(namespaces, p.GetNamespace())
		line, err := d.shapePodOutcome(ctx, p.GetNamespace(), p.GetName())
		if err != nil {
			return nil, err
		}
		ran = ran || strings.HasPrefix(line, "Running")
		d.out.printf("    pod %s/%s: %s\n", p.GetNamespace(), p.GetName(), line)
	}
	if !ran {
		return namespaces, nil
	}
	for _, name := range shapes {
		// The count follows the allocation within about a second
		// (coalesced recounts); a pod that took its devices lowers it.
		s, err := waitShape(ctx, c, name, 15*time.Second, func(s *gpuaas.GpuShape) bool { return s.Status.Placeable != before[name] })
		if err != nil {
			d.out.printf("    placeable still %d after its pod runs: %v\n", before[name], err)
			continue
		}
		d.out.printf("    then placeable %d: %s\n", s.Status.Placeable, s.Status.PlaceableMessage)
	}
	return namespaces, nil
}

// shapePodOutcome waits until a shape's pod runs, is refused, or waits
// unschedulable, and says which: for a running pod, its devices and the
// NUMA node each is on.
func (d *demo) shapePodOutcome(ctx context.Context, ns, name string) (string, error) {
	var outcome string
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, shapePodWait, true, func(ctx context.Context) (bool, error) {
		pod, err := d.cp.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if pod.Status.Phase == v1.PodRunning {
			outcome, err = d.shapePodDevices(ctx, pod)
			return err == nil, err
		}
		if note := shapeRefusal(ctx, d.cp, pod); note != "" {
			outcome = "refused: " + note
			return true, nil
		}
		for _, c := range pod.Status.Conditions {
			if c.Type == v1.PodScheduled && c.Status == v1.ConditionFalse && c.Reason == v1.PodReasonUnschedulable {
				outcome = "waits: " + c.Message
				return true, nil
			}
		}
		return false, nil
	})
	if wait.Interrupted(err) && ctx.Err() == nil {
		pod, getErr := d.cp.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if getErr != nil {
			return "", getErr
		}
		return fmt.Sprintf("after %s: %s", shapePodWait, podState(ctx, d.cp, pod)), nil
	}
	return outcome, err
}

// shapeRefusal is the note of the quota webhook's ShapeUnavailable event
// on pod, "" if there is none.
func shapeRefusal(ctx context.Context, cp *framework.ControlPlane, pod *v1.Pod) string {
	events, err := cp.Client.EventsV1().Events(pod.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return ""
	}
	for _, e := range events.Items {
		if e.Regarding.Name == pod.Name && e.Reason == "ShapeUnavailable" {
			return e.Note
		}
	}
	return ""
}

// shapePodDevices lists the devices of a running pod's claims, each with
// the standard numaNode attribute its slice publishes.
func (d *demo) shapePodDevices(ctx context.Context, pod *v1.Pod) (string, error) {
	devices, err := d.node.WaitForDevices(ctx, 1)
	if err != nil {
		return "", err
	}
	numa := map[string]string{}
	for _, dev := range devices {
		if a, ok := dev.Attributes[resourceapi.QualifiedName("resource.kubernetes.io/numaNode")]; ok && a.IntValue != nil {
			numa[dev.Name] = fmt.Sprint(*a.IntValue)
		}
	}
	var got []string
	for i := range pod.Spec.ResourceClaims {
		name, _, err := resourceclaim.Name(pod, &pod.Spec.ResourceClaims[i])
		if err != nil || name == nil {
			continue
		}
		claim, err := d.cp.Client.ResourceV1().ResourceClaims(pod.Namespace).Get(ctx, *name, metav1.GetOptions{})
		if err != nil {
			return "", fmt.Errorf("getting claim %s/%s: %w", pod.Namespace, *name, err)
		}
		if claim.Status.Allocation == nil {
			continue
		}
		for _, r := range claim.Status.Allocation.Devices.Results {
			got = append(got, fmt.Sprintf("%s (numaNode %s)", r.Device, orDash(numa[r.Device])))
		}
	}
	return "Running on " + strings.Join(got, ", "), nil
}

// waitShape waits up to timeout for the GpuShape name to satisfy cond.
func waitShape(ctx context.Context, c client.Client, name string, timeout time.Duration, cond func(*gpuaas.GpuShape) bool) (*gpuaas.GpuShape, error) {
	var s gpuaas.GpuShape
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		if err := c.Get(ctx, types.NamespacedName{Name: name}, &s); err != nil {
			return false, client.IgnoreNotFound(err)
		}
		return cond(&s), nil
	})
	if err != nil {
		return nil, fmt.Errorf("waiting for GpuShape %s: %w", name, err)
	}
	return &s, nil
}
