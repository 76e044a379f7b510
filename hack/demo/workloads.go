package main

import (
	"fmt"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
)

// workload is an applied object that makes pods: a bare Pod, or a
// controller's object (Deployment, Job, ...) whose pods the
// kube-controller-manager creates after the apply. The report waits for
// the pods it wants, not for those that happen to exist when it looks.
type workload struct {
	kind, namespace, name string
	// want is how many pods should run: 1 for a Pod, the replicas of a
	// Deployment, ReplicaSet or StatefulSet, the parallelism of a Job.
	want int
	// selector finds a controller's pods; nil for a bare Pod, found by name.
	selector labels.Selector
}

// workloadsOf picks the objects that make pods, in the order applied.
// Kinds that make no pods at once (CronJob) or none at all are left out.
func workloadsOf(objs []*unstructured.Unstructured) ([]workload, error) {
	var out []workload
	for _, o := range objs {
		w := workload{kind: o.GetKind(), namespace: o.GetNamespace(), name: o.GetName(), want: 1}
		var err error
		switch w.kind {
		case "Pod":
		case "Deployment", "ReplicaSet", "StatefulSet", "ReplicationController":
			w.want = int(intField(o, 1, "spec", "replicas"))
			w.selector, err = podSelector(o)
		case "DaemonSet":
			// The demo has one GPU node; a DaemonSet runs one pod there.
			w.selector, err = podSelector(o)
		case "Job":
			w.want = jobPods(o)
			// The Job controller labels its pods with the Job's name; the
			// selector the API server sets names its uid, which a file lacks.
			w.selector = labels.SelectorFromSet(labels.Set{"batch.kubernetes.io/job-name": w.name})
		default:
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("%s %s/%s: %w", w.kind, w.namespace, w.name, err)
		}
		out = append(out, w)
	}
	return out, nil
}

// jobPods is how many pods of a Job run at once at the start: its
// parallelism (default 1), no more than its completions, none while it is
// suspended (as Kueue keeps a Job until it admits it).
func jobPods(o *unstructured.Unstructured) int {
	if suspended, _, _ := unstructured.NestedBool(o.Object, "spec", "suspend"); suspended {
		return 0
	}
	n := intField(o, 1, "spec", "parallelism")
	if _, ok, _ := unstructured.NestedFieldNoCopy(o.Object, "spec", "completions"); ok {
		n = min(n, intField(o, n, "spec", "completions"))
	}
	return int(n)
}

// intField reads a number at path, def where there is none. Objects read
// from YAML hold int64 or, decoded as JSON into any, float64.
func intField(o *unstructured.Unstructured, def int64, path ...string) int64 {
	v, _, _ := unstructured.NestedFieldNoCopy(o.Object, path...)
	switch n := v.(type) {
	case int64:
		return n
	case int:
		return int64(n)
	case float64:
		return int64(n)
	}
	return def
}

// podSelector is a controller's spec.selector, or the labels of its pod
// template where it has none (a ReplicationController may omit it).
func podSelector(o *unstructured.Unstructured) (labels.Selector, error) {
	raw, ok, _ := unstructured.NestedMap(o.Object, "spec", "selector")
	if !ok {
		tmpl, _, _ := unstructured.NestedStringMap(o.Object, "spec", "template", "metadata", "labels")
		if len(tmpl) == 0 {
			return nil, fmt.Errorf("neither spec.selector nor pod template labels")
		}
		return labels.SelectorFromSet(tmpl), nil
	}
	if o.GetKind() == "ReplicationController" {
		set := map[string]string{}
		for k, v := range raw {
			set[k] = fmt.Sprint(v)
		}
		return labels.SelectorFromSet(set), nil
	}
	var sel metav1.LabelSelector
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(raw, &sel); err != nil {
		return nil, fmt.Errorf("spec.selector: %w", err)
	}
	return metav1.LabelSelectorAsSelector(&sel)
}

// owns says whether pod is one of w's pods. A controller's pods are those
// its selector matches that a controller owns: a bare pod with the same
// labels is not one of them.
func (w workload) owns(pod *v1.Pod) bool {
	if pod.Namespace != w.namespace || pod.DeletionTimestamp != nil {
		return false
	}
	if w.selector == nil {
		return pod.Name == w.name
	}
	return metav1.GetControllerOf(pod) != nil && w.selector.Matches(labels.Set(pod.Labels))
}

// podTally is what the specs' pods are at one moment.
type podTally struct {
	// running counts pods that run and are ready (or, a Job's, are done),
	// at most want per workload; want is what the workloads want in all.
	running, want int
	// pods are every workload's pods, in the order the workloads were
	// applied, each workload's by name.
	pods []*v1.Pod
	// short names the workloads with fewer pods than they want, e.g.
	// "Deployment team/web: 2 of 4 pods created".
	short []string
}

func (t podTally) done() bool { return t.running >= t.want }

// tally matches pods (those of the workloads' namespaces) to workloads.
func tally(ws []workload, pods []v1.Pod) podTally {
	var t podTally
	for _, w := range ws {
		var mine []*v1.Pod
		running := 0
		for i := range pods {
			if p := &pods[i]; w.owns(p) {
				mine = append(mine, p)
				if podUp(p) {
					running++
				}
			}
		}
		slices.SortFunc(mine, func(a, b *v1.Pod) int { return strings.Compare(a.Name, b.Name) })
		if w.selector == nil && len(mine) == 0 {
			// Reported as not there, with the node's or scheduler's events.
			mine = append(mine, &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: w.namespace, Name: w.name}})
		}
		t.pods = append(t.pods, mine...)
		t.running += min(running, w.want)
		t.want += w.want
		if w.selector != nil && len(mine) < w.want {
			t.short = append(t.short, fmt.Sprintf("%s %s/%s: %d of %d pods created", w.kind, w.namespace, w.name, len(mine), w.want))
		}
	}
	return t
}

// podUp is what the report waits for: running and ready, or done (a Job's
// pod that completed).
func podUp(p *v1.Pod) bool {
	if p.Status.Phase == v1.PodSucceeded {
		return true
	}
	if p.Status.Phase != v1.PodRunning {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == v1.PodReady {
			return c.Status == v1.ConditionTrue
		}
	}
	return false
}
