package e2e

// Tests of the Helm chart in deployments/helm/gpuaas-dra: helm lint, helm
// template, every rendered object accepted by the real kube-apiserver
// (server-side dry-run), values.schema.json refusing bad values, the CRDs
// in the chart identical to config/crd, and the rendered RBAC and
// ValidatingAdmissionPolicy installed for real: the kubelet plugin's
// ServiceAccount may write its own node's ResourceSlices and no other's.
//
// Helm comes from hack/build-helm.sh (_output/bin/helm).

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	admissionregv1 "k8s.io/api/admissionregistration/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	gpuv1alpha1 "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller/webhook"
	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

const (
	chartPath    = "deployments/helm/gpuaas-dra"
	nodeNameKey  = "authentication.kubernetes.io/node-name"
	helmDriver   = "gpu.gpuaas.io"
	helmNodeOK   = "node-a"
	helmNodeDeny = "node-b"
)

// fullValues turns on everything the chart can render: a per-GPU node
// configuration in every mode, tenant quotas, extra controller options.
const fullValues = `
kubeletPlugin:
  cdiHookPath: /usr/bin/nvidia-cdi-hook
  driverRoot: /run/nvidia/driver
  nodeConfig:
    default: {}
    gpus:
    - indexes: [4]
      timeSlicing: {replicas: 4, interval: Default}
    - indexes: [5]
      shared:
        memory: {min: 1Gi, step: 1Gi, default: 2Gi}
    - indexes: [6, 7]
      mig: dynamic
      migProfiles: [1g.10gb, 7g.80gb]
    - uuids: [GPU-00000000-0000-0000-0000-000000000001]
      mig: static
      migModeEnabledByAdmin: true
controller:
  denyUnassigned: true
  exemptNamespaces: [monitoring]
  hardwareProfileNamespace: redhat-ods-applications
  webhook:
    foreignClasses: [nic.example.com]
  priorityClassName: system-cluster-critical
tenantQuotas:
  team-a:
    namespaces: [team-a]
    cohort: research
    limits:
      gpuUnits: "2"
      gpuMemory: 160Gi
`

// helmBin returns the helm binary, or skips (fails under E2E_REQUIRED=1)
// when it has not been built.
func helmBin(t testing.TB) string {
	t.Helper()
	bin := filepath.Join(repoRoot, "_output", "bin", "helm")
	if _, err := os.Stat(bin); err != nil {
		if framework.Required() {
			t.Fatalf("helm not found at %s (E2E_REQUIRED=1): run hack/build-helm.sh", bin)
		}
		t.Skipf("helm not found at %s; run hack/build-helm.sh", bin)
	}
	return bin
}

// runHelm runs helm in the repository root and returns its combined output.
func runHelm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	return framework.RunHelm(framework.Context(t, 2*time.Minute), helmBin(t), args...)
}

// serverVersion is the control plane's version, for helm --kube-version
// (helm template otherwise assumes an old default that the chart refuses).
func serverVersion(t *testing.T) string {
	t.Helper()
	v, err := cp.Client.Discovery().ServerVersion()
	if err != nil {
		t.Fatalf("server version: %v", err)
	}
	return v.GitVersion
}

func writeValues(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// renderChart runs helm template for release into namespace and returns the
// manifest file and its objects.
func renderChart(t *testing.T, release, namespace string, args ...string) (string, []*unstructured.Unstructured) {
	t.Helper()
	all := append([]string{"template", release, chartPath, "--namespace", namespace,
		"--kube-version", serverVersion(t)}, args...)
	out, err := runHelm(t, all...)
	if err != nil {
		t.Fatalf("helm %s: %v\n%s", strings.Join(all, " "), err, out)
	}
	path := filepath.Join(t.TempDir(), "rendered.yaml")
	if err := os.WriteFile(path, []byte(out), 0o600); err != nil {
		t.Fatal(err)
	}
	objs, err := framework.ReadObjects(path)
	if err != nil {
		t.Fatalf("reading rendered chart: %v", err)
	}
	if len(objs) == 0 {
		t.Fatal("helm template rendered no objects")
	}
	return path, objs
}

func kinds(objs []*unstructured.Unstructured) map[string]int {
	m := map[string]int{}
	for _, o := range objs {
		m[o.GetKind()]++
	}
	return m
}

// applyChartCRDs installs the chart's CRDs for real (as helm install does
// before the templates), so the GpuProfiles and TenantQuotas can be
// dry-run.
func applyChartCRDs(t *testing.T) {
	t.Helper()
	ctx := framework.Context(t, time.Minute)
	if _, err := cp.Apply(ctx, filepath.Join(repoRoot, chartPath, "crds"), ""); err != nil {
		t.Fatalf("applying the chart's CRDs: %v", err)
	}
	for _, name := range []string{"gpuprofiles.gpuaas.io", "tenantquotas.gpuaas.io"} {
		err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			_, err := cp.Dynamic.Resource(crdGVR).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			_, err = cp.Client.Discovery().ServerResourcesForGroupVersion("gpuaas.io/v1alpha1")
			return err == nil, nil
		})
		if err != nil {
			t.Fatalf("CRD %s not served: %v", name, err)
		}
	}
}

func TestHelmLint(t *testing.T) {
	helmBin(t) // one skip line when helm is not built
	for name, values := range map[string]string{"defaults": "", "full": fullValues} {
		t.Run(name, func(t *testing.T) {
			args := []string{"lint", "--strict", "--kube-version", serverVersion(t), chartPath}
			if values != "" {
				args = append(args, "--values", writeValues(t, "values.yaml", values))
			}
			out, err := runHelm(t, args...)
			if err != nil || !strings.Contains(out, "0 chart(s) failed") {
				t.Fatalf("helm lint: %v\n%s", err, out)
			}
			for _, line := range strings.Split(out, "\n") {
				if strings.HasPrefix(line, "[WARNING]") || strings.HasPrefix(line, "[ERROR]") {
					t.Errorf("helm lint: %s", line)
				}
			}
		})
	}
}

// TestHelmCRDsMatchConfig: the chart's crds/ are copies of config/crd (make
// generate writes the latter); a stale copy fails here.
func TestHelmCRDsMatchConfig(t *testing.T) {
	want, err := filepath.Glob(filepath.Join(repoRoot, "config", "crd", "*.yaml"))
	if err != nil || len(want) == 0 {
		t.Fatalf("no CRDs in config/crd: %v", err)
	}
	got, _ := filepath.Glob(filepath.Join(repoRoot, chartPath, "crds", "*.yaml"))
	base := func(paths []string) []string {
		var out []string
		for _, p := range paths {
			out = append(out, filepath.Base(p))
		}
		return out
	}
	if !slices.Equal(base(want), base(got)) {
		t.Fatalf("chart crds/ has %v, config/crd has %v: cp config/crd/*.yaml %s/crds/", base(got), base(want), chartPath)
	}
	for _, src := range want {
		a, _ := os.ReadFile(src)
		b, err := os.ReadFile(filepath.Join(repoRoot, chartPath, "crds", filepath.Base(src)))
		if err != nil || !bytes.Equal(a, b) {
			t.Errorf("%s/crds/%s differs from config/crd (%v): cp config/crd/*.yaml %s/crds/", chartPath, filepath.Base(src), err, chartPath)
		}
	}
}

// TestHelmTemplateServerDryRun renders the chart with the defaults and with
// everything on, and has the real kube-apiserver accept every object with a
// server-side dry-run (schema, validation, admission).
func TestHelmTemplateServerDryRun(t *testing.T) {
	helmBin(t) // one skip line when helm is not built
	applyChartCRDs(t)
	kubectl := filepath.Join(cp.BinDir, "kubectl")
	for name, values := range map[string]string{"defaults": "", "full": fullValues} {
		t.Run(name, func(t *testing.T) {
			ns := cp.CreateNamespace(t, "helm-"+name)
			var args []string
			if values != "" {
				args = []string{"--values", writeValues(t, "values.yaml", values)}
			}
			path, objs := renderChart(t, "dry-"+name, ns, args...)
			k := kinds(objs)
			for _, kind := range []string{"DaemonSet", "Deployment", "ConfigMap", "ClusterRole", "Role",
				"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "Service", "GpuProfile"} {
				if k[kind] == 0 {
					t.Errorf("rendered chart has no %s (kinds %v)", kind, k)
				}
			}
			if name == "full" && k["TenantQuota"] != 1 {
				t.Errorf("want 1 TenantQuota from values, got %d", k["TenantQuota"])
			}
			ctx := framework.Context(t, 2*time.Minute)
			cmd := exec.CommandContext(ctx, kubectl, "--kubeconfig", cp.Kubeconfig, "apply",
				"--dry-run=server", "--namespace", ns, "-f", path)
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("kubectl apply --dry-run=server: %v\n%s", err, out)
			}
			accepted := strings.Count(string(out), "(server dry run)")
			if accepted != len(objs) {
				t.Fatalf("apiserver accepted %d of %d objects:\n%s", accepted, len(objs), out)
			}
			t.Logf("%d objects accepted by the apiserver (dry run): %v", accepted, k)
			checkNodeConfig(t, objs, values != "")
		})
	}
}

// checkNodeConfig decodes the rendered ConfigMap with the plugin's own
// strict decoder, so the chart cannot write a file the plugin refuses.
func checkNodeConfig(t *testing.T, objs []*unstructured.Unstructured, full bool) {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() != "ConfigMap" {
			continue
		}
		data, _, _ := unstructured.NestedString(o.Object, "data", "node-config.yaml")
		cfg, err := gpuv1alpha1.DecodeNodeConfig([]byte(data))
		if err != nil {
			t.Fatalf("plugin refuses the rendered node configuration: %v\n%s", err, data)
		}
		if want := map[bool]int{false: 0, true: 4}[full]; len(cfg.GPUs) != want {
			t.Fatalf("node configuration has %d GPU entries, want %d:\n%s", len(cfg.GPUs), want, data)
		}
		if full && (cfg.GPUs[0].TimeSlicing == nil || cfg.GPUs[0].TimeSlicing.Replicas != 4 || cfg.GPUs[2].MIG != gpuv1alpha1.MigDynamic) {
			t.Fatalf("node configuration lost the modes from values:\n%s", data)
		}
		return
	}
	t.Fatal("no ConfigMap with the node configuration rendered")
}

// TestHelmSchemaRejectsBadValues: values.schema.json refuses bad values at
// helm template (and so at helm install), naming the bad field.
func TestHelmSchemaRejectsBadValues(t *testing.T) {
	helmBin(t) // one skip line when helm is not built
	cases := map[string]struct{ values, want string }{
		"time-slicing replicas out of range": {`
kubeletPlugin:
  nodeConfig:
    gpus:
    - indexes: [0]
      timeSlicing: {replicas: 65}
`, "replicas"},
		"unknown GPU mode": {`
kubeletPlugin:
  nodeConfig:
    default:
      mig: always
`, "mig"},
		"bad image pull policy": {`
image:
  pullPolicy: Sometimes
`, "pullPolicy"},
		// Issue 12 item 14: catalog entries were untyped; the API server
		// pruned the misspelled field and the profile matched every GPU.
		"misspelled GpuProfile field": {`
gpuProfiles:
  typo:
    selector: {typ: gpu}
`, "'typ' not allowed"},
		"misspelled TenantQuota limit": {`
tenantQuotas:
  team:
    namespaces: [a]
    limits: {gpuUnit: 2}
`, "'gpuUnit' not allowed"},
		"two modes on one GPU": {`
kubeletPlugin:
  nodeConfig:
    gpus:
    - indexes: [1]
      mig: static
      timeSlicing: {replicas: 2}
`, "gpus/0"},
		"unknown device plugin coexistence": {`
kubeletPlugin:
  devicePluginCoexistence: ignore
`, "devicePluginCoexistence"},
		"device plugin check interval not a duration": {`
kubeletPlugin:
  devicePluginCheckInterval: 30
`, "devicePluginCheckInterval"},
	}
	version := serverVersion(t)
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			out, err := runHelm(t, "template", "bad", chartPath, "--kube-version", version,
				"--values", writeValues(t, "bad-values.yaml", tc.values))
			if err == nil {
				t.Fatalf("helm template accepted bad values:\n%s", tc.values)
			}
			if !strings.Contains(out, "values don't meet the specifications of the schema") || !strings.Contains(out, tc.want) {
				t.Fatalf("helm template failed, but not with a schema error naming %q:\n%s", tc.want, out)
			}
			t.Logf("refused: %s", firstLines(out, 3))
		})
	}
}

func firstLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[:min(n, len(lines))], " | ")
}

// applyChartAccess applies what the rendered chart grants and fences (its
// ServiceAccounts, RBAC and admission policies) into ns, removed when the
// test ends, and returns the name of the ServiceAccount ending in suffix.
// args are more helm template arguments (--set).
func applyChartAccess(t *testing.T, release, ns, suffix string, args ...string) string {
	t.Helper()
	_, objs := renderChart(t, release, ns, args...)
	ctx := framework.Context(t, 3*time.Minute)
	installKinds := []string{"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
		"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
	sa := ""
	for _, o := range objs {
		if !slices.Contains(installKinds, o.GetKind()) {
			continue
		}
		if _, err := cp.ApplyObject(ctx, o, ns); err != nil {
			t.Fatal(err)
		}
		if o.GetNamespace() == "" && o.GetKind() != "ServiceAccount" && o.GetKind() != "Role" && o.GetKind() != "RoleBinding" {
			deleteClusterObjectAtCleanup(t, o)
		}
		if o.GetKind() == "ServiceAccount" && strings.HasSuffix(o.GetName(), suffix) {
			sa = o.GetName()
		}
	}
	if sa == "" {
		t.Fatalf("no ServiceAccount named *%s rendered", suffix)
	}
	return sa
}

// TestHelmPluginWritesOnlyOwnNodeSlices installs the rendered RBAC and
// admission policy, then acts as the kubelet plugin's ServiceAccount with
// the node name a pod-bound token carries.
func TestHelmPluginWritesOnlyOwnNodeSlices(t *testing.T) {
	helmBin(t) // one skip line when helm is not built
	ns := cp.CreateNamespace(t, "helm-rbac")
	release := "rbac"
	ctx := framework.Context(t, 3*time.Minute)
	pluginSA := applyChartAccess(t, release, ns, "-kubelet-plugin")

	asPlugin := func(node string) kubernetes.Interface {
		cfg := rest.CopyConfig(cp.Config)
		cfg.Impersonate = rest.ImpersonationConfig{
			UserName: fmt.Sprintf("system:serviceaccount:%s:%s", ns, pluginSA),
			Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
		}
		if node != "" {
			cfg.Impersonate.Extra = map[string][]string{nodeNameKey: {node}}
		}
		return kubernetes.NewForConfigOrDie(cfg)
	}
	plugin := asPlugin(helmNodeOK)
	adminSlices := cp.Client.ResourceV1().ResourceSlices()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, node := range []string{helmNodeOK, helmNodeDeny} {
			_ = adminSlices.Delete(ctx, sliceName(ns, node), metav1.DeleteOptions{})
		}
	})

	// The policy takes effect a moment after it is created: wait until the
	// slice of another node is refused by it.
	var refusal error
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, refusal = plugin.ResourceV1().ResourceSlices().Create(ctx, testSlice(ns, helmNodeDeny, helmNodeDeny), metav1.CreateOptions{})
		if refusal == nil {
			// Created before the policy was active: remove it and retry.
			_ = adminSlices.Delete(ctx, sliceName(ns, helmNodeDeny), metav1.DeleteOptions{})
			return false, nil
		}
		return strings.Contains(refusal.Error(), "ValidatingAdmissionPolicy"), nil
	})
	if err != nil {
		t.Fatalf("the plugin's ServiceAccount on %s was never refused a slice of %s by the policy; last: %v", helmNodeOK, helmNodeDeny, refusal)
	}
	if !apierrors.IsForbidden(refusal) || !strings.Contains(refusal.Error(), "its own node") {
		t.Fatalf("refusal for another node's slice: want Forbidden naming the own-node rule, got %v", refusal)
	}
	t.Logf("slice for %s refused: %v", helmNodeDeny, refusal)

	// Its own node's slice: created, updated, deleted.
	own, err := plugin.ResourceV1().ResourceSlices().Create(ctx, testSlice(ns, helmNodeOK, helmNodeOK), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("the plugin's ServiceAccount on %s may not create its own slice: %v", helmNodeOK, err)
	}
	t.Logf("slice for %s created as the plugin's ServiceAccount", helmNodeOK)
	own.Spec.Pool.Generation++
	if _, err := plugin.ResourceV1().ResourceSlices().Update(ctx, own, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("updating its own slice: %v", err)
	}

	// Another node's existing slice (made by the admin) may be neither
	// changed nor deleted.
	if _, err := adminSlices.Create(ctx, testSlice(ns, helmNodeDeny, helmNodeDeny), metav1.CreateOptions{}); err != nil {
		t.Fatalf("admin creating %s's slice: %v", helmNodeDeny, err)
	}
	other, err := plugin.ResourceV1().ResourceSlices().Get(ctx, sliceName(ns, helmNodeDeny), metav1.GetOptions{})
	if err != nil {
		t.Fatalf("reading %s's slice as the plugin: %v", helmNodeDeny, err)
	}
	other.Spec.Pool.Generation++
	if _, err := plugin.ResourceV1().ResourceSlices().Update(ctx, other, metav1.UpdateOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("updating %s's slice as %s's plugin: want Forbidden, got %v", helmNodeDeny, helmNodeOK, err)
	}
	if err := plugin.ResourceV1().ResourceSlices().Delete(ctx, sliceName(ns, helmNodeDeny), metav1.DeleteOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("deleting %s's slice as %s's plugin: want Forbidden, got %v", helmNodeDeny, helmNodeOK, err)
	}

	// A token without the node name (not bound to a pod) is refused.
	_, err = asPlugin("").ResourceV1().ResourceSlices().Create(ctx, testSlice(ns, "nonode", helmNodeOK), metav1.CreateOptions{})
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "no node name") {
		t.Fatalf("slice without the node-name extra: want Forbidden by the policy, got %v", err)
	}

	// Its own slice goes away.
	if err := plugin.ResourceV1().ResourceSlices().Delete(ctx, sliceName(ns, helmNodeOK), metav1.DeleteOptions{}); err != nil {
		t.Fatalf("deleting its own slice: %v", err)
	}

	// RBAC least privilege: the plugin reads claims but writes no
	// DeviceClass and reads no Secret.
	if _, err := plugin.ResourceV1().ResourceClaims(ns).List(ctx, metav1.ListOptions{}); err != nil {
		t.Fatalf("listing claims as the plugin: %v", err)
	}
	dc := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "helm-rbac-" + ns}}
	if _, err := plugin.ResourceV1().DeviceClasses().Create(ctx, dc, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("creating a DeviceClass as the plugin: want Forbidden, got %v", err)
	}
	if _, err := plugin.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("listing Secrets as the plugin: want Forbidden, got %v", err)
	}
}

// sliceName is unique per test namespace, so reruns do not collide.
func sliceName(ns, node string) string { return ns + "-" + node }

func testSlice(ns, name, node string) *resourceapi.ResourceSlice {
	return &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: sliceName(ns, name)},
		Spec: resourceapi.ResourceSliceSpec{
			Driver:   helmDriver,
			NodeName: ptrTo(node),
			Pool:     resourceapi.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: 1},
			Devices:  []resourceapi.Device{{Name: "gpu-0"}},
		},
	}
}

func ptrTo[T any](v T) *T { return &v }

// deleteClusterObjectAtCleanup removes a cluster-scoped object the test created.
func deleteClusterObjectAtCleanup(t *testing.T, o *unstructured.Unstructured) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		gvk := o.GroupVersionKind()
		gvr, ok := clusterGVRs[gvk.Kind]
		if !ok {
			return
		}
		err := cp.Dynamic.Resource(gvr).Delete(ctx, o.GetName(), metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) && !errors.Is(err, context.Canceled) {
			t.Errorf("deleting %s %s: %v", gvk.Kind, o.GetName(), err)
		}
	})
}

var (
	crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	// clusterGVRs are the cluster-scoped kinds the RBAC test installs.
	clusterGVRs = map[string]schema.GroupVersionResource{
		"ClusterRole":        {Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "clusterroles"},
		"ClusterRoleBinding": {Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "clusterrolebindings"},
		"ValidatingAdmissionPolicy": {Group: "admissionregistration.k8s.io", Version: "v1",
			Resource: "validatingadmissionpolicies"},
		"ValidatingAdmissionPolicyBinding": {Group: "admissionregistration.k8s.io", Version: "v1",
			Resource: "validatingadmissionpolicybindings"},
	}
)

// TestHelmWebhookConfigMatchesController checks that the webhook
// configuration the chart owns is the one the controller would write:
// same webhooks, rules, failure policies, selectors and service.
func TestHelmWebhookConfigMatchesController(t *testing.T) {
	helmBin(t) // one skip line when helm is not built
	const release, ns = "gpuaas", "gpuaas-system"
	_, objs := renderChart(t, release, ns, "--set", "controller.exemptNamespaces={monitoring}")
	var validating *admissionregv1.ValidatingWebhookConfiguration
	var mutating *admissionregv1.MutatingWebhookConfiguration
	for _, o := range objs {
		switch o.GetKind() {
		case "ValidatingWebhookConfiguration":
			validating = &admissionregv1.ValidatingWebhookConfiguration{}
			fromUnstructured(t, o, validating)
		case "MutatingWebhookConfiguration":
			mutating = &admissionregv1.MutatingWebhookConfiguration{}
			fromUnstructured(t, o, mutating)
		}
	}
	if validating == nil || mutating == nil {
		t.Fatalf("the chart renders a ValidatingWebhookConfiguration: %v, a MutatingWebhookConfiguration: %v", validating != nil, mutating != nil)
	}
	opts := &controller.Options{ExemptNamespaces: []string{"monitoring"}, Webhook: controller.WebhookOptions{
		ServiceNamespace: ns, ServiceName: release + "-gpuaas-dra-controller-webhook", ConfigOwnedByChart: true}}
	if err := opts.Validate(); err != nil {
		t.Fatal(err)
	}
	sameJSON(t, "validating webhooks", validating.Webhooks, webhook.ValidatingConfiguration(&opts.Webhook, opts.ExemptNamespaces).Webhooks)
	sameJSON(t, "mutating webhooks", mutating.Webhooks, webhook.MutatingConfiguration(&opts.Webhook, opts.ExemptNamespaces).Webhooks)
	if validating.Name != mutating.Name {
		t.Errorf("the controller injects its CA into configurations of one name; the chart names them %q and %q", validating.Name, mutating.Name)
	}
}

func fromUnstructured(t *testing.T, o *unstructured.Unstructured, into any) {
	t.Helper()
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, into); err != nil {
		t.Fatal(err)
	}
}

func sameJSON(t *testing.T, what string, chart, controller any) {
	t.Helper()
	got, _ := json.MarshalIndent(chart, "", " ")
	exp, _ := json.MarshalIndent(controller, "", " ")
	if string(got) != string(exp) {
		t.Errorf("chart %s differ from the controller's:\nchart:\n%s\ncontroller:\n%s", what, got, exp)
	}
}

// TestHelmDriverRootsForThePlugin checks that the plugin learns both views
// of the driver root: where its container sees it (a host install is
// mounted at /host) and where the host's runtime does (what CDI specs must
// name). With only the first, specs named /host/... and every GPU
// container failed on a real node.
func TestHelmDriverRootsForThePlugin(t *testing.T) {
	helmBin(t) // one skip line when helm is not built
	for hostRoot, inContainer := range map[string]string{"/": "/host", "/run/nvidia/driver": "/run/nvidia/driver"} {
		_, objs := renderChart(t, "gpuaas", "gpuaas-system", "--set", "kubeletPlugin.driverRoot="+hostRoot)
		env := map[string]string{}
		for _, o := range objs {
			if o.GetKind() != "DaemonSet" {
				continue
			}
			containers, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
			vars, _, _ := unstructured.NestedSlice(containers[0].(map[string]any), "env")
			for _, v := range vars {
				m := v.(map[string]any)
				if value, ok := m["value"].(string); ok {
					env[m["name"].(string)] = value
				}
			}
		}
		if env["NVIDIA_DRIVER_ROOT"] != inContainer || env["NVIDIA_HOST_DRIVER_ROOT"] != hostRoot {
			t.Errorf("driverRoot %s: NVIDIA_DRIVER_ROOT=%q NVIDIA_HOST_DRIVER_ROOT=%q, want %q and %q",
				hostRoot, env["NVIDIA_DRIVER_ROOT"], env["NVIDIA_HOST_DRIVER_ROOT"], inContainer, hostRoot)
		}
	}
}

// TestHelmControllerWritesOnlyItsOwnClassesAndClaims (issue 55 route 7):
// the controller's ServiceAccount may delete any ResourceClaim and write
// any DeviceClass as far as RBAC goes; the chart's policies let it delete
// only claims that hold no other driver's devices, and write only
// DeviceClasses a GpuProfile of their name controls.
func TestHelmControllerWritesOnlyItsOwnClassesAndClaims(t *testing.T) {
	helmBin(t) // one skip line when helm is not built
	ns := cp.CreateNamespace(t, "helm-fence")
	release := "fence"
	ctx := framework.Context(t, 3*time.Minute)
	controllerSA := applyChartAccess(t, release, ns, "-controller")
	cfg := rest.CopyConfig(cp.Config)
	cfg.Impersonate = rest.ImpersonationConfig{
		UserName: fmt.Sprintf("system:serviceaccount:%s:%s", ns, controllerSA),
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
	}
	controller := kubernetes.NewForConfigOrDie(cfg)
	admin := cp.Client

	// Someone else's DeviceClass (NVIDIA's, an admin's): the policy
	// refuses the controller's update, once it is active.
	foreign, err := admin.ResourceV1().DeviceClasses().Create(ctx, &resourceapi.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: "fence-foreign-" + ns}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = admin.ResourceV1().DeviceClasses().Delete(context.Background(), foreign.Name, metav1.DeleteOptions{})
	})
	var refusal error
	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		got, err := admin.ResourceV1().DeviceClasses().Get(ctx, foreign.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		got.Labels = map[string]string{"taken": "over"}
		_, refusal = controller.ResourceV1().DeviceClasses().Update(ctx, got, metav1.UpdateOptions{})
		return refusal != nil && strings.Contains(refusal.Error(), "ValidatingAdmissionPolicy"), nil
	})
	if err != nil || !apierrors.IsForbidden(refusal) || !strings.Contains(refusal.Error(), "a GpuProfile of the same name controls") {
		t.Fatalf("the controller's update of a foreign DeviceClass: want Forbidden by the policy, got %v (%v)", refusal, err)
	}
	if err := controller.ResourceV1().DeviceClasses().Delete(ctx, foreign.Name, metav1.DeleteOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("the controller's delete of a foreign DeviceClass: want Forbidden, got %v", err)
	}
	// A class its profile renders: created, updated, deleted. The profile
	// exists (disabled: no controller renders it), or the garbage collector
	// deletes the class of an absent owner before the test does.
	installCRDs(t)
	ownerProfile := profile("fence-owned-"+ns, gpuaas.ProfileSelector{})
	ownerProfile.Spec.Enabled = ptrTo(false)
	createObject(t, ownerProfile)
	owned := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "fence-owned-" + ns, OwnerReferences: []metav1.OwnerReference{{
		APIVersion: "gpuaas.io/v1alpha1", Kind: "GpuProfile", Name: ownerProfile.Name, UID: ownerProfile.UID, Controller: ptrTo(true)}}}}
	owned, err = controller.ResourceV1().DeviceClasses().Create(ctx, owned, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("the controller creating its profile's DeviceClass: %v", err)
	}
	t.Cleanup(func() {
		_ = admin.ResourceV1().DeviceClasses().Delete(context.Background(), owned.Name, metav1.DeleteOptions{})
	})
	owned.Labels = map[string]string{"rendered": "again"}
	if owned, err = controller.ResourceV1().DeviceClasses().Update(ctx, owned, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("the controller updating its profile's DeviceClass: %v", err)
	}
	owned.OwnerReferences = nil
	if _, err := controller.ResourceV1().DeviceClasses().Update(ctx, owned, metav1.UpdateOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("the controller dropping its profile's control of a DeviceClass: want Forbidden, got %v", err)
	}
	if err := controller.ResourceV1().DeviceClasses().Delete(ctx, owned.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("the controller deleting its profile's DeviceClass: %v", err)
	}

	// Claims: one allocated another driver's device is refused; one of
	// ours, and an unallocated one, are deleted.
	claims := admin.ResourceV1().ResourceClaims(ns)
	allocated := func(name, driver string) *resourceapi.ResourceClaim {
		c, err := claims.Create(ctx, &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
				Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "any"}}}}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if driver == "" {
			return c
		}
		c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{
			Request: "gpu", Driver: driver, Pool: "node-1", Device: "gpu-0"}}}}
		if c, err = claims.UpdateStatus(ctx, c, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		return c
	}
	other := allocated("other-driver", "gpu.nvidia.com")
	if err := controller.ResourceV1().ResourceClaims(ns).Delete(ctx, other.Name, metav1.DeleteOptions{}); !apierrors.IsForbidden(err) ||
		!strings.Contains(err.Error(), "no other driver's devices") {
		t.Fatalf("the controller deleting a claim of another driver's devices: want Forbidden by the policy, got %v", err)
	}
	for _, c := range []*resourceapi.ResourceClaim{allocated("ours", helmDriver), allocated("unallocated", "")} {
		if err := controller.ResourceV1().ResourceClaims(ns).Delete(ctx, c.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatalf("the controller deleting claim %s: %v", c.Name, err)
		}
	}
}
