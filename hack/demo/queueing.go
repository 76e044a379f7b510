package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/yaml"

	"github.com/gpuaas/gpu-dra-driver/pkg/controller/kueuemirror"
	"github.com/gpuaas/gpu-dra-driver/pkg/kueue"
	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

// queueingNamespaces are the teams of demo/queueing.
var queueingNamespaces = []string{"ml-a", "ml-b"}

// queueingScenario runs Kueue's manager with the deviceClassMappings the
// dra-controller rendered from the catalog, applies demo/queueing in two
// steps, and prints what Kueue decided after each. With the built-in
// specs, their pods (objs) are deleted first, so that the GPUs Kueue hands
// out are free; pods of one's own specs are left alone and keep their
// GPUs. It is skipped, with one line, when Kueue is not built.
func (d *demo) queueingScenario(ctx context.Context, objs []*unstructured.Unstructured) error {
	if missing := kueueMissing(d.cp); missing != "" {
		d.out.printf("\nQueueing: skipped (%s; `make kueue` builds it).\n", missing)
		return nil
	}
	if err := d.freeSpecGPUs(ctx, objs, "Queueing", "Kueue's jobs get what is left"); err != nil {
		return err
	}
	root, err := framework.RepoRoot()
	if err != nil {
		return err
	}
	dir := filepath.Join(root, "demo", "queueing")
	if err := d.ensureProfiles(ctx, root, "Queueing", filepath.Join(dir, "10-jobs.yaml"), filepath.Join(dir, "20-urgent.yaml")); err != nil {
		return err
	}
	d.out.printf("Queueing: Kueue %s with the deviceClassMappings the dra-controller rendered from the catalog ...\n", kueueVersion())
	resources, err := d.renderedMappings(ctx)
	if err != nil {
		return err
	}
	// The rendered transformations charge extended resources in GPU
	// units only with Kueue's own DRA path for them off (docs/kueue.md).
	// The dashboard's workloads (dashboardStep) ask CPU and memory too,
	// which the ClusterQueues here do not cover: Kueue leaves them to the
	// scheduler.
	resources["excludeResourcePrefixes"] = []any{"cpu", "memory"}
	k, err := d.cp.StartKueue(ctx, framework.KueueOptions{Resources: resources, FeatureGates: kueue.ExtendedResourceGate + "=false"})
	if err != nil {
		return err
	}
	defer func() { _ = k.Stop(context.WithoutCancel(ctx)) }()
	for _, step := range []struct{ file, title string }{
		{"00-queues.yaml", ""},
		{"10-jobs.yaml", "Team A preprocesses on 4 x 1g and trains on an H100, borrowing; team B evaluates on 2 x 1g:"},
		{"20-urgent.yaml", "Team B's urgent job needs an H100 of its own quota back:"},
	} {
		if err := d.applyQueueing(ctx, filepath.Join(dir, step.file)); err != nil {
			return err
		}
		if step.title == "" {
			continue
		}
		d.out.printf("  %s\n", step.title)
		if err := d.reportQueues(ctx); err != nil {
			return err
		}
	}
	return d.dashboardStep(ctx, root)
}

// ensureProfiles creates the catalog entries (GpuProfiles) that the claim
// templates of a scenario's files name and the cluster lacks, from the
// built-in demo/specs/quota/00-profiles.yaml: specs of one's own may have
// none, and the dra-controller renders a profile's DeviceClass (and Kueue's
// mappings) from the catalog. Entries that exist are left as they are.
func (d *demo) ensureProfiles(ctx context.Context, root, scenario string, files ...string) error {
	var jobs []*unstructured.Unstructured
	for _, file := range files {
		objs, err := framework.ReadObjects(file)
		if err != nil {
			return err
		}
		jobs = append(jobs, objs...)
	}
	return d.ensureCatalogProfiles(ctx, root, scenario, claimClasses(jobs)...)
}

// ensureCatalogProfiles creates the named GpuProfiles the cluster lacks
// from the built-in demo/specs/quota/00-profiles.yaml.
func (d *demo) ensureCatalogProfiles(ctx context.Context, root, scenario string, names ...string) error {
	catalog, err := framework.ReadObjects(filepath.Join(root, "demo", "specs", "quota", "00-profiles.yaml"))
	if err != nil {
		return err
	}
	profiles := d.cp.Dynamic.Resource(gpuProfiles)
	for _, p := range profilesFor(names, catalog) {
		_, err := profiles.Get(ctx, p.GetName(), metav1.GetOptions{})
		if err == nil {
			continue
		}
		if !apierrors.IsNotFound(err) {
			return fmt.Errorf("getting GpuProfile %s: %w", p.GetName(), err)
		}
		d.out.printf("%s: adding GpuProfile %s (demo/specs/quota), which it uses.\n", scenario, p.GetName())
		if _, err := d.cp.ApplyObject(ctx, p, ""); err != nil {
			return err
		}
	}
	return nil
}

var gpuProfiles = schema.GroupVersionResource{Group: "gpuaas.io", Version: "v1alpha1", Resource: "gpuprofiles"}

// claimClasses are the DeviceClasses that the ResourceClaimTemplates among
// objs request, in order, each once.
func claimClasses(objs []*unstructured.Unstructured) []string {
	var out []string
	for _, o := range objs {
		if o.GetKind() != "ResourceClaimTemplate" {
			continue
		}
		requests, _, _ := unstructured.NestedSlice(o.Object, "spec", "spec", "devices", "requests")
		for _, r := range requests {
			req, _ := r.(map[string]any)
			class, _, _ := unstructured.NestedString(req, "exactly", "deviceClassName")
			if class != "" && !slices.Contains(out, class) {
				out = append(out, class)
			}
		}
	}
	return out
}

// profilesFor picks the GpuProfiles of catalog that render the classes: a
// GpuProfile's DeviceClass is named after it.
func profilesFor(classes []string, catalog []*unstructured.Unstructured) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range catalog {
		if o.GetKind() == "GpuProfile" && slices.Contains(classes, o.GetName()) {
			out = append(out, o)
		}
	}
	return out
}

// freeSpecGPUs deletes the built-in specs' pods (objs) before a scenario
// that wants free GPUs; the pods of one's own specs keep theirs, and the
// scenario says so with what it then gets.
func (d *demo) freeSpecGPUs(ctx context.Context, objs []*unstructured.Unstructured, scenario, then string) error {
	if d.opts.scenarios.freeSpecPods {
		return d.deletePods(ctx, objs)
	}
	d.out.printf("\n%s: the pods of your specs keep their GPUs; %s.\n", scenario, then)
	return nil
}

// deletePods deletes the pods among objs and waits until they are gone;
// once: the shapes and the queueing scenario both want the GPUs free.
func (d *demo) deletePods(ctx context.Context, objs []*unstructured.Unstructured) error {
	if d.specPodsDeleted {
		return nil
	}
	seen := map[string]bool{}
	var namespaces []string
	for _, o := range objs {
		if o.GetKind() == "Pod" && !seen[o.GetNamespace()] {
			seen[o.GetNamespace()] = true
			namespaces = append(namespaces, o.GetNamespace())
		}
	}
	d.out.printf("\nDeleting the pods of the specs above, so that the scenarios below have free GPUs ...\n")
	if err := d.deletePodsIn(ctx, namespaces); err != nil {
		return err
	}
	d.specPodsDeleted = true
	return nil
}

// deletePodsIn deletes every pod of the namespaces and waits until they
// are gone, which frees their GPUs.
func (d *demo) deletePodsIn(ctx context.Context, namespaces []string) error {
	for _, ns := range namespaces {
		if err := d.cp.Client.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
			return fmt.Errorf("deleting the pods of %s: %w", ns, err)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for _, ns := range namespaces {
		if err := d.cp.WaitForNoPods(ctx, ns); err != nil {
			return err
		}
	}
	return nil
}

// applyQueueing applies one file of demo/queueing; on the real node, Jobs
// run the gpuinfo workload on the host network, as the demo's pods do.
func (d *demo) applyQueueing(ctx context.Context, file string) error {
	objs, err := framework.ReadObjects(file)
	if err != nil {
		return err
	}
	for _, obj := range objs {
		if d.real != nil && obj.GetKind() == "Job" {
			if err := framework.UseWorkloadImageInJob(obj); err != nil {
				return err
			}
		}
		if _, err := d.cp.ApplyObject(ctx, obj, ""); err != nil {
			return fmt.Errorf("%s: %w", file, err)
		}
	}
	return nil
}

func kueueMissing(cp *framework.ControlPlane) string {
	bin := filepath.Join(cp.BinDir, "kueue")
	if _, err := os.Stat(bin); err != nil {
		return "no " + bin
	}
	return ""
}

func kueueVersion() string {
	root, err := framework.RepoRoot()
	if err != nil {
		return ""
	}
	return framework.KueueVersion(filepath.Join(root, "_output", "kueue"))
}

// renderedMappings waits for the controller's ConfigMap and returns its
// mappings as the resources section of Kueue's configuration.
func (d *demo) renderedMappings(ctx context.Context) (map[string]any, error) {
	var rendered string
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := d.cp.Client.CoreV1().ConfigMaps("").List(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + kueuemirror.MappingsConfigMap})
		if err != nil || len(list.Items) == 0 {
			return false, nil
		}
		rendered = list.Items[0].Data[kueuemirror.MappingsKey]
		return strings.Contains(rendered, "mig-1g"), nil
	})
	if err != nil {
		return nil, fmt.Errorf("waiting for the dra-controller's ConfigMap %s: %w", kueuemirror.MappingsConfigMap, err)
	}
	var resources map[string]any
	if err := yaml.Unmarshal([]byte(rendered), &resources); err != nil {
		return nil, fmt.Errorf("reading the rendered mappings: %w", err)
	}
	return resources, nil
}

// reportQueues waits until Kueue and the pods have settled (no change for
// 5 s), then prints every job and both queues.
func (d *demo) reportQueues(ctx context.Context) error {
	var last string
	stableSince := time.Now()
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		now, err := d.queueTable(ctx)
		if err != nil {
			return false, err
		}
		if now != last {
			last, stableSince = now, time.Now()
		}
		return time.Since(stableSince) > 5*time.Second, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for Kueue to settle: %w", err)
	}
	d.out.printf("%s", last)
	return nil
}

func (d *demo) queueTable(ctx context.Context) (string, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "    %-14s %-9s %-9s %-10s %s\n", "JOB", "PRIORITY", "CHARGED", "KUEUE", "PODS")
	for _, ns := range queueingNamespaces {
		jobs, err := d.cp.KueueJobs(ctx, ns, kueue.DefaultResource)
		if err != nil {
			return "", err
		}
		for _, j := range jobs {
			pods, err := d.jobPods(ctx, ns, j.Name)
			if err != nil {
				return "", err
			}
			fmt.Fprintf(&b, "    %-14s %-9s %-9s %-10s %s\n", ns+"/"+j.Name, orDash(j.Priority), charged(j), kueueState(j), pods)
		}
	}
	for _, cq := range queueingNamespaces {
		total, borrowed, err := d.cp.ClusterQueueUsage(ctx, cq, kueue.DefaultResource)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(&b, "    ClusterQueue %s: %d milli-units in use, %d borrowed\n", cq, total, borrowed)
	}
	return b.String(), nil
}

func (d *demo) jobPods(ctx context.Context, ns, job string) (string, error) {
	list, err := d.cp.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "batch.kubernetes.io/job-name=" + job})
	if err != nil {
		return "", fmt.Errorf("listing pods of %s/%s: %w", ns, job, err)
	}
	running := 0
	for _, p := range list.Items {
		if p.Status.Phase == corev1.PodRunning {
			running++
		}
	}
	return fmt.Sprintf("%d running of %d", running, len(list.Items)), nil
}

func charged(j framework.KueueJob) string {
	if !j.Admitted {
		return "-"
	}
	return fmt.Sprint(j.Charged)
}

func kueueState(j framework.KueueJob) string {
	switch {
	case j.Admitted:
		return "admitted"
	case j.Evicted != "":
		return strings.ToLower(j.Evicted)
	}
	return "waiting"
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
