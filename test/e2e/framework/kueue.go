package framework

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	certutil "k8s.io/client-go/util/cert"
	"sigs.k8s.io/yaml"
)

// KueueNamespace is where the Kueue manager keeps what it namespaces.
const KueueNamespace = "kueue-system"

// kueueWebhookGroups are the API groups whose Kueue webhooks the harness
// installs: Kueue's own objects and batch Jobs. The webhooks of the other
// integrations (pods, Deployments, JobSets...) are left out, so that a
// Kueue manager stopped at the end of its tests leaves nothing that every
// later pod of the shared control plane must pass.
var kueueWebhookGroups = []string{"kueue.x-k8s.io", "batch"}

// KueueOptions configure StartKueue.
type KueueOptions struct {
	// Binary is the kueue manager; default <BinDir>/kueue (hack/build-kueue.sh).
	Binary string
	// Dir holds the CRDs and webhook manifests of the same release;
	// default <repo>/_output/kueue.
	Dir string
	// Resources is the configuration's `resources` section (e.g.
	// deviceClassMappings), as YAML-ready data.
	Resources map[string]any
	// FairSharing turns on Kueue's fair sharing among the ClusterQueues of
	// a cohort.
	FairSharing bool
	// FeatureGates are set on Kueue's manager (name=value, comma
	// separated), besides VisibilityOnDemand=false.
	FeatureGates string
}

// Kueue is a running Kueue manager.
type Kueue struct {
	Process *Process
	cp      *ControlPlane
	hooks   []*unstructured.Unstructured
}

// StartKueue installs Kueue's CRDs and webhooks and runs its manager against
// the control plane, the webhooks served on 127.0.0.1 with a certificate of
// the harness (Kueue's own certificate management wants a Service). It
// returns once the manager's webhooks answer.
func (cp *ControlPlane) StartKueue(ctx context.Context, opts KueueOptions) (*Kueue, error) {
	if err := cp.kueueDefaults(&opts); err != nil {
		return nil, err
	}
	if err := cp.installKueueCRDs(ctx, opts.Dir); err != nil {
		return nil, err
	}
	if err := cp.ensureNamespace(ctx, KueueNamespace); err != nil {
		return nil, err
	}
	ports, err := FreePorts(2)
	if err != nil {
		return nil, err
	}
	certDir := filepath.Join(cp.Dir, "kueue-certs")
	caBundle, err := writeServingCert(certDir)
	if err != nil {
		return nil, err
	}
	if err := ensureKueueMetricsCert(); err != nil {
		return nil, err
	}
	config, err := kueueConfig(opts, ports[0], ports[1], certDir)
	if err != nil {
		return nil, err
	}
	configPath := filepath.Join(cp.Dir, "kueue-config.yaml")
	if err := os.WriteFile(configPath, config, 0o600); err != nil {
		return nil, fmt.Errorf("writing Kueue's configuration: %w", err)
	}
	k := &Kueue{cp: cp}
	if k.hooks, err = kueueWebhooks(filepath.Join(opts.Dir, "webhook", "manifests.yaml"), ports[0], caBundle); err != nil {
		return nil, err
	}
	k.Process = NewProcess("kueue", opts.Binary, filepath.Join(cp.LogDir, "kueue.log"),
		"--config", configPath, "--kubeconfig", cp.Kubeconfig,
		"--feature-gates", strings.Trim("VisibilityOnDemand=false,"+opts.FeatureGates, ","), "--zap-log-level", "2")
	if err := k.Process.Start(); err != nil {
		return nil, err
	}
	if err := k.install(ctx, fmt.Sprintf("http://127.0.0.1:%d/readyz", ports[1])); err != nil {
		return nil, errors.Join(err, k.Stop(context.WithoutCancel(ctx)))
	}
	return k, nil
}

// KueueVersion is the version hack/build-kueue.sh built into dir, or "".
func KueueVersion(dir string) string {
	v, err := os.ReadFile(filepath.Join(dir, "VERSION"))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(v))
}

// installKueueCRDs applies Kueue's CRDs and waits until its kinds are
// served: the manager refuses to start before.
func (cp *ControlPlane) installKueueCRDs(ctx context.Context, dir string) error {
	if _, err := cp.Apply(ctx, filepath.Join(dir, "crds"), ""); err != nil {
		return fmt.Errorf("installing Kueue's CRDs: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	plurals := []string{"workloads", "clusterqueues", "localqueues", "resourceflavors", "cohorts", "workloadpriorityclasses"}
	err := wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		for _, plural := range plurals {
			if _, err := cp.Dynamic.Resource(KueueResource(plural)).List(ctx, metav1.ListOptions{Limit: 1}); err != nil {
				return false, nil
			}
		}
		// Kueue's manager maps kinds through discovery, which the API
		// server updates a moment after it serves the resources: started
		// in between, it exited with `no matches for kind "Workload"`.
		gv := KueueResource("").GroupVersion().String()
		list, err := cp.Client.Discovery().ServerResourcesForGroupVersion(gv)
		if err != nil {
			return false, nil
		}
		found := map[string]bool{}
		for _, r := range list.APIResources {
			found[r.Name] = true
		}
		for _, plural := range plurals {
			if !found[plural] {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for Kueue's CRDs to be served: %w", err)
	}
	return nil
}

func (cp *ControlPlane) kueueDefaults(opts *KueueOptions) error {
	if opts.Binary == "" {
		opts.Binary = filepath.Join(cp.BinDir, "kueue")
	}
	if opts.Dir == "" {
		root, err := RepoRoot()
		if err != nil {
			return err
		}
		opts.Dir = filepath.Join(root, "_output", "kueue")
	}
	if _, err := os.Stat(opts.Binary); err != nil {
		return fmt.Errorf("kueue manager not built (make kueue): %w", err)
	}
	return nil
}

// install waits for the manager to be ready, then puts its webhooks in
// front of the API and waits until they answer.
func (k *Kueue) install(ctx context.Context, readyURL string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := waitHealthy(ctx, k.Process, readyURL, ""); err != nil {
		return fmt.Errorf("waiting for the Kueue manager: %w", err)
	}
	for _, hook := range k.hooks {
		if _, err := k.cp.ApplyObject(ctx, hook, ""); err != nil {
			return fmt.Errorf("installing Kueue's webhooks: %w", err)
		}
	}
	return k.waitForWebhooks(ctx)
}

// waitForWebhooks dry-runs a ResourceFlavor until Kueue's webhook admits it.
func (k *Kueue) waitForWebhooks(ctx context.Context) error {
	flavor := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
		"metadata": map[string]any{"name": "webhook-probe"},
	}}
	ri := k.cp.Dynamic.Resource(KueueResource("resourceflavors"))
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var last error
	err := wait.PollUntilContextCancel(ctx, 250*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		if exited, err := k.Process.Exited(); exited {
			return false, fmt.Errorf("kueue exited: %w\n%s", err, k.Process.Tail(20))
		}
		_, last = ri.Create(ctx, flavor, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return last == nil, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for Kueue's webhooks: %w", errors.Join(err, last))
	}
	return nil
}

// Stop stops the manager and removes its webhooks, so that nothing is left
// that fails Jobs or Kueue objects for the tests that follow.
func (k *Kueue) Stop(ctx context.Context) error {
	errs := []error{k.Process.Stop()}
	for _, hook := range k.hooks {
		ri, err := k.cp.resourceFor(hook, "")
		if err == nil {
			err = ri.Delete(ctx, hook.GetName(), metav1.DeleteOptions{})
		}
		if err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("removing Kueue's webhook %s: %w", hook.GetName(), err))
		}
	}
	return errors.Join(errs...)
}

// KueueResource is the GroupVersionResource of one of Kueue's kinds.
func KueueResource(plural string) schema.GroupVersionResource {
	return schema.GroupVersionResource{Group: "kueue.x-k8s.io", Version: "v1beta2", Resource: plural}
}

func kueueConfig(opts KueueOptions, webhookPort, healthPort int, certDir string) ([]byte, error) {
	cfg := map[string]any{
		"apiVersion": "config.kueue.x-k8s.io/v1beta2",
		"kind":       "Configuration",
		"namespace":  KueueNamespace,
		"health":     map[string]any{"healthProbeBindAddress": fmt.Sprintf("127.0.0.1:%d", healthPort)},
		"metrics":    map[string]any{"bindAddress": "0"},
		"webhook":    map[string]any{"host": "127.0.0.1", "port": webhookPort, "certDir": certDir},
		// One manager: no election to wait for.
		"leaderElection":             map[string]any{"leaderElect": false},
		"internalCertManagement":     map[string]any{"enable": false},
		"manageJobsWithoutQueueName": false,
		"integrations":               map[string]any{"frameworks": []string{"batch/job"}},
	}
	if opts.Resources != nil {
		cfg["resources"] = opts.Resources
	}
	if opts.FairSharing {
		cfg["fairSharing"] = map[string]any{"preemptionStrategies": []string{"LessThanOrEqualToFinalShare", "LessThanInitialShare"}}
	}
	out, err := yaml.Marshal(cfg)
	if err != nil {
		return nil, fmt.Errorf("rendering Kueue's configuration: %w", err)
	}
	return out, nil
}

// writeServingCert writes a self-signed certificate for 127.0.0.1 as
// tls.crt and tls.key (the names controller-runtime's webhook server
// reads) and returns it as the CA bundle.
func writeServingCert(dir string) ([]byte, error) {
	crt, key, err := certutil.GenerateSelfSignedCertKey("127.0.0.1", nil, []string{"localhost"})
	if err != nil {
		return nil, fmt.Errorf("generating a serving certificate: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating %s: %w", dir, err)
	}
	for name, data := range map[string][]byte{"tls.crt": crt, "tls.key": key} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			return nil, fmt.Errorf("writing %s: %w", name, err)
		}
	}
	return crt, nil
}

// kueueMetricsCertDir is where Kueue's manager, when it does not manage its
// own certificates, reads its metrics certificate: a fixed path (v0.19.2
// cmd/kueue/main.go), read at start even with metrics off.
const kueueMetricsCertDir = "/etc/kueue/metrics/certs"

// ensureKueueMetricsCert writes a throwaway certificate there unless one
// exists. The metrics endpoint stays off (bindAddress "0").
func ensureKueueMetricsCert() error {
	if _, err := os.Stat(filepath.Join(kueueMetricsCertDir, "tls.key")); err == nil {
		return nil
	}
	if _, err := writeServingCert(kueueMetricsCertDir); err != nil {
		return fmt.Errorf("kueue's manager needs a certificate in %s (run the e2e tests as root, or put one there): %w", kueueMetricsCertDir, err)
	}
	return nil
}

// kueueWebhooks reads the release's webhook configurations and points
// every webhook of kueueWebhookGroups at url https://127.0.0.1:port<path>.
func kueueWebhooks(manifests string, port int, caBundle []byte) ([]*unstructured.Unstructured, error) {
	objs, err := ReadObjects(manifests)
	if err != nil {
		return nil, err
	}
	for _, obj := range objs {
		obj.SetName("kueue-" + obj.GetName())
		hooks, _, err := unstructured.NestedSlice(obj.Object, "webhooks")
		if err != nil {
			return nil, fmt.Errorf("%s: %w", obj.GetName(), err)
		}
		kept := make([]any, 0, len(hooks))
		for _, h := range hooks {
			hook, ok := h.(map[string]any)
			if !ok || !inGroups(hook, kueueWebhookGroups) {
				continue
			}
			path, _, _ := unstructured.NestedString(hook, "clientConfig", "service", "path")
			hook["clientConfig"] = map[string]any{
				"url":      fmt.Sprintf("https://127.0.0.1:%d%s", port, path),
				"caBundle": base64.StdEncoding.EncodeToString(caBundle),
			}
			kept = append(kept, hook)
		}
		if err := unstructured.SetNestedSlice(obj.Object, kept, "webhooks"); err != nil {
			return nil, err
		}
	}
	return objs, nil
}

func inGroups(hook map[string]any, groups []string) bool {
	rules, _, _ := unstructured.NestedSlice(hook, "rules")
	for _, r := range rules {
		rule, _ := r.(map[string]any)
		apiGroups, _, _ := unstructured.NestedStringSlice(rule, "apiGroups")
		for _, g := range apiGroups {
			if !slices.Contains(groups, g) {
				return false
			}
		}
	}
	return len(rules) > 0
}

func (cp *ControlPlane) ensureNamespace(ctx context.Context, name string) error {
	ns := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": name},
	}}
	if _, err := cp.ApplyObject(ctx, ns, ""); err != nil {
		return fmt.Errorf("creating namespace %s: %w", name, err)
	}
	return nil
}

// KueueJob is what Kueue decided about one Job, as the demo prints it.
type KueueJob struct {
	Namespace, Name string
	// Priority is the WorkloadPriorityClass, "" for none.
	Priority string
	// Admitted: quota reserved and admitted now.
	Admitted bool
	// Charged is the admitted workload's usage of resource, all pods.
	Charged int64
	// Evicted is the reason of a True Evicted condition (e.g.
	// Preempted), "" when none.
	Evicted string
}

// KueueJobs reads the Workloads of a namespace, one per Job that owns one.
func (cp *ControlPlane) KueueJobs(ctx context.Context, namespace, resourceName string) ([]KueueJob, error) {
	list, err := cp.Dynamic.Resource(KueueResource("workloads")).Namespace(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing workloads of %s: %w", namespace, err)
	}
	var jobs []KueueJob
	for i := range list.Items {
		wl := &list.Items[i]
		job := ""
		for _, ref := range wl.GetOwnerReferences() {
			if ref.Kind == "Job" {
				job = ref.Name
			}
		}
		if job == "" {
			continue
		}
		priority, _, _ := unstructured.NestedString(wl.Object, "spec", "priorityClassRef", "name")
		charged, admitted := WorkloadCharge(wl, resourceName)
		jobs = append(jobs, KueueJob{Namespace: namespace, Name: job, Priority: priority,
			Admitted: admitted, Charged: charged, Evicted: conditionReason(wl, "Evicted")})
	}
	slices.SortFunc(jobs, func(a, b KueueJob) int { return strings.Compare(a.Name, b.Name) })
	return jobs, nil
}

// WorkloadCharge is what an admitted workload is charged of a resource (all
// its pods together), and whether it is admitted.
func WorkloadCharge(wl *unstructured.Unstructured, resourceName string) (int64, bool) {
	if wl == nil || conditionReason(wl, "Admitted") == "" {
		return 0, false
	}
	psas, _, _ := unstructured.NestedSlice(wl.Object, "status", "admission", "podSetAssignments")
	var total int64
	for _, p := range psas {
		m, _ := p.(map[string]any)
		usage, _, _ := unstructured.NestedString(m, "resourceUsage", resourceName)
		if q, err := resource.ParseQuantity(usage); err == nil {
			total += q.Value()
		}
	}
	return total, true
}

// conditionReason is the reason of a True condition ("True" when it has
// none), "" when the condition is not True.
func conditionReason(obj *unstructured.Unstructured, condType string) string {
	conds, _, _ := unstructured.NestedSlice(obj.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] != condType || m["status"] != "True" {
			continue
		}
		if reason, _ := m["reason"].(string); reason != "" {
			return reason
		}
		return "True"
	}
	return ""
}

// ClusterQueueUsage is a ClusterQueue's total and borrowed use of a
// resource.
func (cp *ControlPlane) ClusterQueueUsage(ctx context.Context, name, resourceName string) (total, borrowed int64, err error) {
	cq, err := cp.Dynamic.Resource(KueueResource("clusterqueues")).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return 0, 0, fmt.Errorf("reading ClusterQueue %s: %w", name, err)
	}
	flavors, _, _ := unstructured.NestedSlice(cq.Object, "status", "flavorsUsage")
	for _, f := range flavors {
		res, _ := f.(map[string]any)["resources"].([]any)
		for _, r := range res {
			m, _ := r.(map[string]any)
			if m["name"] != resourceName {
				continue
			}
			total += quantityValue(m["total"])
			borrowed += quantityValue(m["borrowed"])
		}
	}
	return total, borrowed, nil
}

func quantityValue(v any) int64 {
	if v == nil {
		return 0
	}
	q, err := resource.ParseQuantity(fmt.Sprint(v))
	if err != nil {
		return 0
	}
	return q.Value()
}
