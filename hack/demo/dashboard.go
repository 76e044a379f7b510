package main

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/gpuaas/gpu-dra-driver/pkg/hardwareprofile"
	"github.com/gpuaas/gpu-dra-driver/pkg/kueue"
	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

var tenantQuotas = schema.GroupVersionResource{Group: "gpuaas.io", Version: "v1alpha1", Resource: "tenantquotas"}

var hardwareProfiles = schema.GroupVersionResource{Group: hardwareprofile.GroupVersionKind.Group,
	Version: hardwareprofile.GroupVersionKind.Version, Resource: "hardwareprofiles"}

// dashboardNamespace, dashboardProfile and dashboardQueue are the tenant
// of demo/queueing/30-dashboard.yaml, the catalog entry its workload picks
// and its LocalQueue.
const (
	dashboardNamespace = "notebooks"
	dashboardProfile   = "shared-4way"
	dashboardQueue     = "gpus"
)

// dashboardStep runs with Kueue up (the queueing scenario's): it installs
// the HardwareProfile CRD as the tests model it, applies the Kueue-managed
// tenant of demo/queueing/30-dashboard.yaml, prints every HardwareProfile
// the dra-controller published, and starts one workload as the dashboard's
// admission makes it from the tenant's shared-4way HardwareProfile; then
// prints where it runs, what Kueue charged and what the TenantQuota holds.
func (d *demo) dashboardStep(ctx context.Context, root string) error {
	d.out.printf("\nOpenShift AI: the dra-controller publishes the catalog as HardwareProfiles (%s) where that CRD is served;\n  installing it (as test/e2e/testdata/hardwareprofile models it) and a Kueue-managed tenant, %s ...\n",
		hardwareprofile.GroupVersionKind.GroupVersion(), dashboardNamespace)
	if _, err := d.cp.Apply(ctx, filepath.Join(root, "test", "e2e", "testdata", "hardwareprofile"), ""); err != nil {
		return fmt.Errorf("installing the HardwareProfile CRD: %w", err)
	}
	if err := d.ensureCatalogProfiles(ctx, root, "OpenShift AI", dashboardProfile); err != nil {
		return err
	}
	if err := d.applyQueueing(ctx, filepath.Join(root, "demo", "queueing", "30-dashboard.yaml")); err != nil {
		return err
	}
	var hp *unstructured.Unstructured
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		got, err := d.cp.Dynamic.Resource(hardwareProfiles).Namespace(dashboardNamespace).Get(ctx, hardwareprofile.Name(dashboardProfile), metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		queue, _, _ := unstructured.NestedString(got.Object, "spec", "scheduling", "kueue", "localQueueName")
		hp = got
		return queue == dashboardQueue, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for HardwareProfile %s/%s queued through %s: %w", dashboardNamespace, dashboardProfile, dashboardQueue, err)
	}
	list, err := d.cp.Dynamic.Resource(hardwareProfiles).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("listing HardwareProfiles: %w", err)
	}
	// Every tenant namespace gets the whole catalog: the table shows the
	// dashboard tenant's and the shapes' (each where its template is).
	var shown []unstructured.Unstructured
	namespaces := map[string]bool{}
	for _, item := range list.Items {
		namespaces[item.GetNamespace()] = true
		if _, shape, _ := unstructured.NestedString(item.Object, "spec", "dra", "resourceClaimTemplateName"); shape || item.GetNamespace() == dashboardNamespace {
			shown = append(shown, item)
		}
	}
	d.out.printf("  %d HardwareProfiles published in %d namespaces; %s's and the shapes':\n", len(list.Items), len(namespaces), dashboardNamespace)
	d.out.printf("%s", indent(hardwareProfileTable(shown), "    "))

	job, err := framework.DashboardJob(dashboardNamespace, "notebook", "registry.k8s.io/pause:3.10", hp)
	if err != nil {
		return err
	}
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(job)
	if err != nil {
		return err
	}
	obj := &unstructured.Unstructured{Object: m}
	if d.real != nil {
		if err := framework.UseWorkloadImageInJob(obj); err != nil {
			return err
		}
	}
	d.out.printf("  A notebook started as the dashboard starts it from %s/%s (its identifiers' defaults as requests and limits, label kueue.x-k8s.io/queue-name=%s):\n",
		dashboardNamespace, hp.GetName(), dashboardQueue)
	if _, err := d.cp.ApplyObject(ctx, obj, ""); err != nil {
		return err
	}
	return d.reportDashboardJob(ctx)
}

// reportDashboardJob waits for the notebook's pod to run and prints its
// device, Kueue's charge and the TenantQuota's.
func (d *demo) reportDashboardJob(ctx context.Context) error {
	var pod *corev1.Pod
	var charged int64
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		jobs, err := d.cp.KueueJobs(ctx, dashboardNamespace, kueue.DefaultResource)
		if err != nil || len(jobs) == 0 || !jobs[0].Admitted {
			return false, nil
		}
		charged = jobs[0].Charged
		pods, err := d.cp.Client.CoreV1().Pods(dashboardNamespace).List(ctx, metav1.ListOptions{LabelSelector: "batch.kubernetes.io/job-name=notebook"})
		if err != nil || len(pods.Items) == 0 || pods.Items[0].Status.Phase != corev1.PodRunning {
			return false, nil
		}
		pod = &pods.Items[0]
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for the notebook to be admitted by Kueue and run: %w", err)
	}
	device := "no claim (not through DRA)"
	if st := pod.Status.ExtendedResourceClaimStatus; st != nil {
		claim, err := d.cp.Client.ResourceV1().ResourceClaims(dashboardNamespace).Get(ctx, st.ResourceClaimName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if a := claim.Status.Allocation; a != nil && len(a.Devices.Results) > 0 {
			r := a.Devices.Results[0]
			class := ""
			if reqs := claim.Spec.Devices.Requests; len(reqs) > 0 && reqs[0].Exactly != nil {
				class = reqs[0].Exactly.DeviceClassName
			}
			device = fmt.Sprintf("%s/%s (claim %s, class %s)", r.Pool, r.Device, claim.Name, class)
		}
	}
	used := "?"
	if q, err := d.cp.Dynamic.Resource(tenantQuotas).Get(ctx, dashboardNamespace, metav1.GetOptions{}); err == nil {
		if u, ok, _ := unstructured.NestedString(q.Object, "status", "used", "gpuUnits"); ok {
			used = u
		}
	}
	d.out.printf("    pod %s runs on %s, device %s\n    Kueue charged it %d %s; TenantQuota %s uses %s GPU units\n",
		pod.Name, pod.Spec.NodeName, device, charged, kueue.DefaultResource, dashboardNamespace, used)
	return nil
}

// hardwareProfileTable is the HardwareProfiles as the demo prints them:
// where, what the dashboard shows, how it is scheduled and what a workload
// started with it asks, sorted by namespace and name.
func hardwareProfileTable(items []unstructured.Unstructured) string {
	items = slices.Clone(items)
	slices.SortFunc(items, func(a, b unstructured.Unstructured) int {
		return strings.Compare(a.GetNamespace()+"/"+a.GetName(), b.GetNamespace()+"/"+b.GetName())
	})
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	_, _ = fmt.Fprintln(w, "NAMESPACE\tNAME\tDISPLAY NAME\tSCHEDULING\tASKS")
	for _, hp := range items {
		sched, _, _ := unstructured.NestedString(hp.Object, "spec", "scheduling", "type")
		if queue, ok, _ := unstructured.NestedString(hp.Object, "spec", "scheduling", "kueue", "localQueueName"); ok {
			sched += " (" + queue + ")"
		}
		var asks []string
		ids, _, _ := unstructured.NestedSlice(hp.Object, "spec", "identifiers")
		for _, id := range ids {
			if m, ok := id.(map[string]any); ok {
				asks = append(asks, fmt.Sprintf("%v %v", m["identifier"], m["defaultCount"]))
			}
		}
		if tmpl, ok, _ := unstructured.NestedString(hp.Object, "spec", "dra", "resourceClaimTemplateName"); ok {
			asks = append(asks, "template "+tmpl)
		}
		name := hp.GetAnnotations()[hardwareprofile.DisplayNameAnnotation]
		if hp.GetAnnotations()[hardwareprofile.DisabledAnnotation] == "true" {
			name += " (disabled)"
		}
		_, _ = fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", hp.GetNamespace(), hp.GetName(), name, sched, strings.Join(asks, ", "))
	}
	_ = w.Flush()
	return b.String()
}

func indent(s, prefix string) string {
	lines := strings.SplitAfter(s, "\n")
	for i, l := range lines {
		if l != "" {
			lines[i] = prefix + l
		}
	}
	return strings.Join(lines, "")
}
