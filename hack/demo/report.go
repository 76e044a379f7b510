package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/dynamic-resource-allocation/resourceclaim"

	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
	"github.com/gpuaas/gpu-dra-driver/test/kubeletsim"
)

// describeNode prints what the plugin published, grouped by model.
func (d *demo) describeNode(ctx context.Context) error {
	devices, err := d.node.WaitForDevices(ctx, 1)
	if err != nil {
		return err
	}
	models := map[string]int{}
	for _, dev := range devices {
		models[fmt.Sprintf("%s %s", attribute(dev, "type"), capacity(dev, "memory"))]++
	}
	var parts []string
	for model, n := range models {
		parts = append(parts, fmt.Sprintf("%d x %s", n, model))
	}
	sort.Strings(parts)
	d.out.printf("  %d devices of %s published: %s\n  CDI specs go to %s\n", len(devices), attribute(devices[0], "productName"),
		strings.Join(parts, ", "), d.nodeCDIRoot)
	return nil
}

// attribute reads a string attribute published under the driver's domain.
func attribute(dev resourceapi.Device, name string) string {
	for _, key := range []string{name, framework.DriverName + "/" + name} {
		if a, ok := dev.Attributes[resourceapi.QualifiedName(key)]; ok && a.StringValue != nil {
			return *a.StringValue
		}
	}
	return "?"
}

func capacity(dev resourceapi.Device, name string) string {
	for _, key := range []string{name, framework.DriverName + "/" + name} {
		if c, ok := dev.Capacity[resourceapi.QualifiedName(key)]; ok {
			return c.Value.String()
		}
	}
	return "?"
}

// kinds summarises the applied objects of one file, e.g. "Namespace,
// ResourceClaimTemplate, Pod".
func kinds(objs []*unstructured.Unstructured) string {
	var out []string
	for _, o := range objs {
		out = append(out, o.GetKind())
	}
	return strings.Join(out, ", ")
}

// waitForPods waits, within the timeout, until the pods the specs ask for
// run: bare Pods, and those their controllers make (a Deployment's
// replicas, a Job's parallelism), counted from the specs rather than from
// the pods that exist at the time, which a controller creates a moment
// after the apply. It returns each pod as last seen: a pod that does not
// run is reported, not fatal.
func (d *demo) waitForPods(ctx context.Context, objs []*unstructured.Unstructured, begin time.Time) ([]*v1.Pod, error) {
	ws, err := workloadsOf(objs)
	if err != nil {
		return nil, err
	}
	var namespaces []string
	for _, w := range ws {
		if !slices.Contains(namespaces, w.namespace) {
			namespaces = append(namespaces, w.namespace)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, d.opts.timeout)
	defer cancel()
	var last podTally
	_ = wait.PollUntilContextCancel(ctx, 500*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		var pods []v1.Pod
		for _, ns := range namespaces {
			list, err := d.cp.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
			if err != nil {
				return false, nil // the timeout decides; the report shows the last state
			}
			pods = append(pods, list.Items...)
		}
		last = tally(ws, pods)
		return last.done(), nil
	})
	d.out.printf("%d of %d pods running %.1fs after the first apply\n", last.running, last.want, time.Since(begin).Seconds())
	for _, s := range last.short {
		d.out.printf("  %s\n", s)
	}
	return last.pods, nil
}

// report prints, per pod, its claims, the devices allocated to them, the
// CDI devices the node got from the plugin, the CDI spec files and, on the
// real node, what each container saw.
func (d *demo) report(ctx context.Context, pods []*v1.Pod) error {
	allocated := map[string]bool{}
	for _, pod := range pods {
		d.out.printf("\n%s/%s: %s\n", pod.Namespace, pod.Name, podState(ctx, d.cp, pod))
		for i := range pod.Spec.ResourceClaims {
			pc := &pod.Spec.ResourceClaims[i]
			name, _, err := resourceclaim.Name(pod, pc)
			if err != nil || name == nil {
				d.out.printf("  claim %s: not created yet\n", pc.Name)
				continue
			}
			if err := d.reportClaim(ctx, pod, "claim "+pc.Name, *name, containersUsing(pod, pc.Name), allocated); err != nil {
				return err
			}
		}
		if st := pod.Status.ExtendedResourceClaimStatus; st != nil {
			if err := d.reportClaim(ctx, pod, "extended resources", st.ResourceClaimName, "its limits", allocated); err != nil {
				return err
			}
		}
		d.reportContainers(pod)
	}
	devices, err := d.node.WaitForDevices(ctx, 1)
	if err != nil {
		return err
	}
	d.out.printf("\n%d of %d devices of %s allocated.\n", len(allocated), len(devices), d.opts.nodeName)
	return nil
}

func (d *demo) reportClaim(ctx context.Context, pod *v1.Pod, what, name, users string, allocated map[string]bool) error {
	out := d.out
	claim, err := d.cp.Client.ResourceV1().ResourceClaims(pod.Namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("getting claim %s/%s: %w", pod.Namespace, name, err)
	}
	shared := ""
	if len(claim.Status.ReservedFor) > 1 {
		shared = fmt.Sprintf(" (shared by %d pods)", len(claim.Status.ReservedFor))
	}
	out.printf("  %s -> ResourceClaim %s%s, used by %s\n", what, claim.Name, shared, users)
	if claim.Status.Allocation == nil {
		out.printf("    not allocated\n")
		return nil
	}
	for _, r := range claim.Status.Allocation.Devices.Results {
		out.printf("    device %s/%s (request %s)\n", r.Pool, r.Device, r.Request)
		allocated[r.Pool+"/"+r.Device] = true
	}
	for _, id := range cdiDevices(pod)[claim.Name] {
		out.printf("    cdi    %s\n", id)
	}
	spec := d.node.CDISpecPath(claim.UID)
	if _, err := os.Stat(spec); err == nil {
		out.printf("    spec   %s\n", filepath.Base(spec))
	}
	return nil
}

// podState is "Running", or why the pod is not: the scheduler's message or
// the node's last warning.
func podState(ctx context.Context, cp *framework.ControlPlane, pod *v1.Pod) string {
	if pod.Status.Phase == v1.PodRunning {
		return "Running"
	}
	state := string(pod.Status.Phase)
	for _, c := range pod.Status.Conditions {
		if c.Type == v1.PodScheduled && c.Status == v1.ConditionFalse {
			return state + ": " + c.Message
		}
	}
	events, err := cp.Client.CoreV1().Events(pod.Namespace).List(ctx, metav1.ListOptions{
		FieldSelector: "involvedObject.name=" + pod.Name + ",type=Warning",
	})
	if err == nil && len(events.Items) > 0 {
		last := events.Items[len(events.Items)-1]
		return fmt.Sprintf("%s: %s: %s", state, last.Reason, last.Message)
	}
	return state
}

func cdiDevices(pod *v1.Pod) map[string][]string {
	var devices map[string][]string
	_ = json.Unmarshal([]byte(pod.Annotations[kubeletsim.CDIDevicesAnnotation]), &devices)
	return devices
}

// containersUsing names the containers that reference a pod claim.
func containersUsing(pod *v1.Pod, claim string) string {
	var names []string
	for _, c := range append(pod.Spec.InitContainers, pod.Spec.Containers...) {
		for _, rc := range c.Resources.Claims {
			if rc.Name == claim {
				names = append(names, c.Name)
			}
		}
	}
	if len(names) == 0 {
		return "no container"
	}
	return "container " + strings.Join(names, ", ")
}

// droppedAlternatives names, for each ResourceClaim of a file, the
// firstAvailable alternatives it asked for that its stored spec lacks: the
// controller's alternatives webhook dropped those its tenant's quota did
// not admit.
func droppedAlternatives(file, stored []*unstructured.Unstructured) []string {
	kept := map[string]map[string]bool{}
	for _, o := range stored {
		if o.GetKind() == "ResourceClaim" {
			kept[o.GetNamespace()+"/"+o.GetName()] = alternatives(o)
		}
	}
	var out []string
	for _, o := range file {
		have, ok := kept[o.GetNamespace()+"/"+o.GetName()]
		if o.GetKind() != "ResourceClaim" || !ok {
			continue
		}
		var gone []string
		for name := range alternatives(o) {
			if !have[name] {
				gone = append(gone, name)
			}
		}
		if len(gone) > 0 {
			slices.Sort(gone)
			out = append(out, fmt.Sprintf("%s/%s: %s", o.GetNamespace(), o.GetName(), strings.Join(gone, ", ")))
		}
	}
	return out
}

// alternatives are a claim's firstAvailable alternatives as "request/alternative".
func alternatives(claim *unstructured.Unstructured) map[string]bool {
	out := map[string]bool{}
	requests, _, _ := unstructured.NestedSlice(claim.Object, "spec", "devices", "requests")
	for _, r := range requests {
		req, _ := r.(map[string]any)
		subs, _, _ := unstructured.NestedSlice(req, "firstAvailable")
		for _, sub := range subs {
			if m, ok := sub.(map[string]any); ok {
				out[fmt.Sprint(req["name"], "/", m["name"])] = true
			}
		}
	}
	return out
}
