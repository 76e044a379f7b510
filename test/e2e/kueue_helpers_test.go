package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/gpuaas/gpu-dra-driver/pkg/controller"
	"github.com/gpuaas/gpu-dra-driver/pkg/kueue"
	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

// kueueHelper creates and watches the Kueue objects of one subtest.
type kueueHelper struct {
	t *testing.T
	// queues are the ClusterQueues created, by name, to change their quota.
	queues map[string]*unstructured.Unstructured
}

// jobSpec is a Job of pods that each hold one device of a class, or
// what claim says.
type jobSpec struct {
	class    string
	claim    *resourceapi.ResourceClaimSpec
	pods     int32
	priority string
	// nodeSelector pins the Job's pods.
	nodeSelector map[string]string
}

func (kq *kueueHelper) apply(ctx context.Context, doc string) *unstructured.Unstructured {
	kq.t.Helper()
	obj := &unstructured.Unstructured{}
	if err := yaml.Unmarshal([]byte(doc), &obj.Object); err != nil {
		kq.t.Fatalf("parsing %s: %v", doc, err)
	}
	out, err := cp.ApplyObject(ctx, obj, "")
	if err != nil {
		kq.t.Fatalf("applying: %v", err)
	}
	return out
}

// deleteAtCleanup removes a cluster-scoped Kueue object when the test ends.
func (kq *kueueHelper) deleteAtCleanup(plural, name string) {
	kq.t.Cleanup(func() {
		err := cp.Dynamic.Resource(framework.KueueResource(plural)).Delete(context.Background(), name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			kq.t.Errorf("deleting %s %s: %v", plural, name, err)
		}
	})
}

// deleteJobsAtCleanup deletes the namespace's Jobs before the namespace
// (cleanups run last-in first-out): the namespace deletion waits for the
// pods to go, which a running Job would keep replacing.
func (kq *kueueHelper) deleteJobsAtCleanup(ns string) {
	kq.t.Cleanup(func() {
		err := cp.Client.BatchV1().Jobs(ns).DeleteCollection(context.Background(),
			metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)}, metav1.ListOptions{})
		if err != nil {
			kq.t.Errorf("deleting the jobs of %s: %v", ns, err)
		}
	})
}

func (kq *kueueHelper) unique(prefix string) string {
	return fmt.Sprintf("%s-%d", prefix, time.Now().UnixNano()%1_000_000)
}

// team makes a namespace, a ClusterQueue of the same name with nominal
// milli-units of GPU (in a cohort when one is named), and a LocalQueue
// "queue" in the namespace pointing at it.
func (kq *kueueHelper) team(prefix, cohort string, nominal int64, preemption map[string]any) string {
	kq.t.Helper()
	ctx := framework.Context(kq.t, time.Minute)
	ns := cp.CreateNamespace(kq.t, prefix)
	kq.deleteJobsAtCleanup(ns)
	spec := map[string]any{
		"namespaceSelector": map[string]any{"matchLabels": map[string]any{"kubernetes.io/metadata.name": ns}},
		// Covering other drivers' devices, as the ClusterQueues the
		// controller keeps do (docs/kueue.md).
		"resourceGroups": []any{map[string]any{
			"coveredResources": []any{kueue.DefaultResource, kueue.OtherDevicesResource},
			"flavors": []any{map[string]any{"name": "gpuaas", "resources": []any{map[string]any{
				"name": kueue.DefaultResource, "nominalQuota": fmt.Sprint(nominal),
			}, map[string]any{"name": kueue.OtherDevicesResource, "nominalQuota": fmt.Sprint(kueue.OtherDevicesQuota)}}}},
		}},
	}
	if cohort != "" {
		spec["cohortName"] = cohort
	}
	if preemption != nil {
		spec["preemption"] = preemption
	}
	cq := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
		"metadata": map[string]any{"name": ns}, "spec": spec,
	}}
	kq.applyQueue(ctx, cq)
	kq.deleteAtCleanup("clusterqueues", ns)
	kq.apply(ctx, fmt.Sprintf(`apiVersion: kueue.x-k8s.io/v1beta2
kind: LocalQueue
metadata: {name: queue, namespace: %s}
spec: {clusterQueue: %s}`, ns, ns))
	return ns
}

func (kq *kueueHelper) applyQueue(ctx context.Context, cq *unstructured.Unstructured) {
	kq.t.Helper()
	if kq.queues == nil {
		kq.queues = map[string]*unstructured.Unstructured{}
	}
	if _, err := cp.ApplyObject(ctx, cq.DeepCopy(), ""); err != nil {
		kq.t.Fatalf("applying ClusterQueue: %v", err)
	}
	kq.queues[cq.GetName()] = cq
}

// queue is the ClusterQueue of a team's namespace.
func (kq *kueueHelper) queue(ns string) string { return ns }

// setQuota changes a ClusterQueue's nominal quota.
func (kq *kueueHelper) setQuota(ctx context.Context, name string, nominal int64) {
	kq.t.Helper()
	cq := kq.queues[name].DeepCopy()
	groups, _, _ := unstructured.NestedSlice(cq.Object, "spec", "resourceGroups")
	flavor := groups[0].(map[string]any)["flavors"].([]any)[0].(map[string]any)
	flavor["resources"].([]any)[0].(map[string]any)["nominalQuota"] = fmt.Sprint(nominal)
	if err := unstructured.SetNestedSlice(cq.Object, groups, "spec", "resourceGroups"); err != nil {
		kq.t.Fatal(err)
	}
	kq.applyQueue(ctx, cq)
}

func (kq *kueueHelper) priorityClass(name string, value int) {
	ctx := framework.Context(kq.t, time.Minute)
	kq.apply(ctx, fmt.Sprintf(`apiVersion: kueue.x-k8s.io/v1beta2
kind: WorkloadPriorityClass
metadata: {name: %s}
value: %d`, name, value))
	kq.deleteAtCleanup("workloadpriorityclasses", name)
}

// job creates a ResourceClaimTemplate and a Job queued in the namespace's
// LocalQueue; each of its pods holds one device of the class.
func (kq *kueueHelper) job(ctx context.Context, ns, name string, spec jobSpec) {
	kq.t.Helper()
	pods := max(spec.pods, 1)
	tmpl := &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: spec.class}}},
		}}},
	}
	if spec.claim != nil {
		tmpl.Spec.Spec = *spec.claim
	}
	if _, err := cp.Client.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
		kq.t.Fatalf("creating template %s: %v", name, err)
	}
	labels := map[string]string{"kueue.x-k8s.io/queue-name": "queue"}
	if spec.priority != "" {
		labels["kueue.x-k8s.io/priority-class"] = spec.priority
	}
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels},
		Spec: batchv1.JobSpec{
			Parallelism: ptr.To(pods), Completions: ptr.To(pods), Suspend: ptr.To(true),
			Template: v1.PodTemplateSpec{Spec: v1.PodSpec{
				RestartPolicy:  v1.RestartPolicyNever,
				NodeSelector:   spec.nodeSelector,
				ResourceClaims: []v1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptr.To(name)}},
				Containers: []v1.Container{{
					Name: "main", Image: "registry.k8s.io/pause:3.10",
					Resources: v1.ResourceRequirements{Claims: []v1.ResourceClaim{{Name: "gpu"}}},
				}},
			}},
		},
	}
	if _, err := cp.Client.BatchV1().Jobs(ns).Create(ctx, job, metav1.CreateOptions{}); err != nil {
		kq.t.Fatalf("creating job %s: %v", name, err)
	}
}

// extendedJob queues a Job whose pod asks one of an extended resource, in
// its requests and limits, as the dashboard's hardware profiles write it.
func (kq *kueueHelper) extendedJob(ctx context.Context, ns, name, resourceName string) {
	kq.t.Helper()
	one := v1.ResourceList{v1.ResourceName(resourceName): resource.MustParse("1")}
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"kueue.x-k8s.io/queue-name": "queue"}},
		Spec: batchv1.JobSpec{
			Parallelism: ptr.To[int32](1), Completions: ptr.To[int32](1), Suspend: ptr.To(true),
			Template: v1.PodTemplateSpec{Spec: v1.PodSpec{
				RestartPolicy: v1.RestartPolicyNever,
				Containers: []v1.Container{{
					Name: "main", Image: "registry.k8s.io/pause:3.10",
					Resources: v1.ResourceRequirements{Requests: one, Limits: one},
				}},
			}},
		},
	}
	if _, err := cp.Client.BatchV1().Jobs(ns).Create(ctx, job, metav1.CreateOptions{}); err != nil {
		kq.t.Fatalf("creating job %s: %v", name, err)
	}
}

// gpuJobs queues n Jobs of one whole GPU each, named prefix-0...
func (kq *kueueHelper) gpuJobs(ctx context.Context, ns, prefix string, n int) []string {
	kq.t.Helper()
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("%s-%d", prefix, i)
		kq.job(ctx, ns, names[i], jobSpec{class: "gpu.gpuaas.io"})
	}
	return names
}

func (kq *kueueHelper) waitAllAdmitted(ctx context.Context, ns string, jobs []string) {
	kq.t.Helper()
	for _, job := range jobs {
		kq.waitAdmitted(ctx, ns, job)
	}
}

func (kq *kueueHelper) deleteJob(ctx context.Context, ns, name string) {
	kq.t.Helper()
	err := cp.Client.BatchV1().Jobs(ns).Delete(ctx, name, metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)})
	if err != nil {
		kq.t.Fatalf("deleting job %s: %v", name, err)
	}
	kq.poll(ctx, "workload of job "+name+" gone", func(ctx context.Context) (bool, error) {
		wl, err := kq.workload(ctx, ns, name)
		return wl == nil, err
	})
}

// workload is the Workload Kueue made for a Job, or nil.
func (kq *kueueHelper) workload(ctx context.Context, ns, job string) (*unstructured.Unstructured, error) {
	list, err := cp.Dynamic.Resource(framework.KueueResource("workloads")).Namespace(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	for i := range list.Items {
		for _, ref := range list.Items[i].GetOwnerReferences() {
			if ref.Kind == "Job" && ref.Name == job {
				return &list.Items[i], nil
			}
		}
	}
	return nil, nil
}

// admittedUsage is what an admitted workload is charged in GPU milli-units
// (all its pods together), and whether it is admitted.
func admittedUsage(wl *unstructured.Unstructured) (int64, bool) {
	return framework.WorkloadCharge(wl, kueue.DefaultResource)
}

// waitAdmitted waits until Kueue admits the Job's workload and returns its
// charge.
func (kq *kueueHelper) waitAdmitted(ctx context.Context, ns, job string) int64 {
	kq.t.Helper()
	var usage int64
	kq.poll(ctx, "job "+job+" admitted", func(ctx context.Context) (bool, error) {
		wl, err := kq.workload(ctx, ns, job)
		u, ok := admittedUsage(wl)
		usage = u
		return ok, err
	})
	return usage
}

// staysPending checks that the Job's workload exists and is not admitted
// for d.
func (kq *kueueHelper) staysPending(ctx context.Context, ns, job string, d time.Duration) {
	kq.t.Helper()
	kq.poll(ctx, "workload of job "+job, func(ctx context.Context) (bool, error) {
		wl, err := kq.workload(ctx, ns, job)
		return wl != nil, err
	})
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		wl, err := kq.workload(ctx, ns, job)
		if err != nil {
			kq.t.Fatal(err)
		}
		if _, ok := admittedUsage(wl); ok {
			kq.t.Fatalf("job %s was admitted; it should wait", job)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// usage is a ClusterQueue's GPU milli-units in use.
func (kq *kueueHelper) usage(ctx context.Context, name string) int64 {
	kq.t.Helper()
	total, _, err := cp.ClusterQueueUsage(ctx, name, kueue.DefaultResource)
	if err != nil {
		kq.t.Fatal(err)
	}
	return total
}

// waitNominal waits until a ClusterQueue exists with the nominal quota.
func (kq *kueueHelper) waitNominal(ctx context.Context, name string, want int64) {
	kq.t.Helper()
	var got string
	kq.poll(ctx, fmt.Sprintf("ClusterQueue %s with nominal quota %d", name, want), func(ctx context.Context) (bool, error) {
		cq, err := cp.Dynamic.Resource(framework.KueueResource("clusterqueues")).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		groups, _, _ := unstructured.NestedSlice(cq.Object, "spec", "resourceGroups")
		if len(groups) == 0 {
			return false, nil
		}
		flavor := groups[0].(map[string]any)["flavors"].([]any)[0].(map[string]any)
		got = fmt.Sprint(flavor["resources"].([]any)[0].(map[string]any)["nominalQuota"])
		return got == fmt.Sprint(want), nil
	})
}

// waitShares samples two ClusterQueues' usage every second until they hold
// wantA and wantB, and returns the samples.
func (kq *kueueHelper) waitShares(ctx context.Context, a, b string, wantA, wantB int64) string {
	kq.t.Helper()
	var samples []string
	start := time.Now()
	kq.poll(ctx, fmt.Sprintf("shares %d/%d", wantA, wantB), func(ctx context.Context) (bool, error) {
		ua, ub := kq.usage(ctx, a), kq.usage(ctx, b)
		samples = append(samples, fmt.Sprintf("%.0fs %d/%d", time.Since(start).Seconds(), ua, ub))
		return ua == wantA && ub == wantB, nil
	})
	return strings.Join(samples, ", ")
}

// pendingWorkloads counts the namespace's workloads not admitted now.
func (kq *kueueHelper) pendingWorkloads(ctx context.Context, ns string) int {
	kq.t.Helper()
	list, err := cp.Dynamic.Resource(framework.KueueResource("workloads")).Namespace(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		kq.t.Fatal(err)
	}
	n := 0
	for i := range list.Items {
		if _, ok := admittedUsage(&list.Items[i]); !ok {
			n++
		}
	}
	return n
}

// jobPods lists the pods of a Job.
func (kq *kueueHelper) jobPods(ctx context.Context, ns, job string) []v1.Pod {
	kq.t.Helper()
	pods, err := cp.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "batch.kubernetes.io/job-name=" + job})
	if err != nil {
		kq.t.Fatal(err)
	}
	return pods.Items
}

// waitRunningPods waits until n pods of the Job run on the node.
func (kq *kueueHelper) waitRunningPods(ctx context.Context, ns, job string, n int) {
	kq.t.Helper()
	kq.poll(ctx, fmt.Sprintf("%d pods of job %s running", n, job), func(ctx context.Context) (bool, error) {
		pods, err := cp.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "batch.kubernetes.io/job-name=" + job})
		if err != nil {
			return false, nil // the poll reports the timeout
		}
		running := 0
		for _, p := range pods.Items {
			if p.Status.Phase == v1.PodRunning {
				running++
			}
		}
		return running == n, nil
	})
}

func (kq *kueueHelper) poll(ctx context.Context, what string, cond wait.ConditionWithContextFunc) {
	kq.t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := wait.PollUntilContextCancel(ctx, 250*time.Millisecond, true, cond); err != nil {
		kq.t.Fatalf("waiting for %s: %v", what, err)
	}
}

// startKueueWithController starts the real Kueue manager (stopped when the
// test ends, its log shown if it failed) and the dra-controller as the
// chart's controller.kueue runs it, which keeps the ResourceFlavor and
// judges every claim of the test, and waits for that flavor.
func startKueueWithController(t *testing.T, opts framework.KueueOptions, more ...func(*controller.Options)) {
	t.Helper()
	k, err := cp.StartKueue(framework.Context(t, 5*time.Minute), opts)
	if err != nil {
		t.Fatalf("starting Kueue: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("kueue log %s, last lines:\n%s", k.Process.LogPath, k.Process.Tail(40))
		}
		if err := k.Stop(context.Background()); err != nil {
			t.Errorf("stopping Kueue: %v", err)
		}
	})
	startControllerWith(t, func(o *controller.Options) {
		o.Kueue = true
		for _, set := range more {
			set(o)
		}
	})
	waitForFlavor(t)
}
