package chart

import (
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	admissionregv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/gpuaas/gpu-dra-driver/pkg/controller/webhook"
)

// TestControllerMemory (issue 52): the controller's memory request and
// limit, and the limit passed to the process (GPUAAS_MEMORY_LIMIT, from
// which it sets the Go collector's target), so the heap is collected
// before the kernel kills the container.
func TestControllerMemory(t *testing.T) {
	ctr := controllerContainer(t, controllerDeployment(t, render(t)))
	if got := ctr.Resources.Requests[corev1.ResourceMemory]; got.Cmp(resource.MustParse("128Mi")) != 0 {
		t.Errorf("memory request %s, want 128Mi", &got)
	}
	if got := ctr.Resources.Limits[corev1.ResourceMemory]; got.Cmp(resource.MustParse("512Mi")) != 0 {
		t.Errorf("memory limit %s, want 512Mi (2x the fleet benchmark's peak at 1,000 nodes)", &got)
	}
	var found bool
	for _, e := range ctr.Env {
		if e.Name != "GPUAAS_MEMORY_LIMIT" {
			continue
		}
		found = true
		ref := e.ValueFrom
		if ref == nil || ref.ResourceFieldRef == nil || ref.ResourceFieldRef.Resource != "limits.memory" ||
			ref.ResourceFieldRef.ContainerName != ctr.Name {
			t.Errorf("GPUAAS_MEMORY_LIMIT = %+v, want the container's limits.memory", e)
		}
	}
	if !found {
		t.Error("the controller is not told its memory limit (GPUAAS_MEMORY_LIMIT)")
	}
}

// TestControllerPriorityClass (issue 52): the controller's pods have a
// priority by default, the chart's own PriorityClass (one named
// system-cluster-critical is refused outside kube-system where the cluster
// limits it), so the pods whose claims its fail-closed webhook admits do
// not preempt it; a class named in the values is used instead, and the
// chart then creates none.
func TestControllerPriorityClass(t *testing.T) {
	objs := render(t)
	pod := controllerDeployment(t, objs).Spec.Template.Spec
	classes := priorityClasses(t, objs)
	if len(classes) != 1 || pod.PriorityClassName != classes[0].Name {
		t.Fatalf("controller pods' priorityClassName %q, PriorityClasses rendered %v; want the chart's own", pod.PriorityClassName, classes)
	}
	if classes[0].Value != 1_000_000_000 || classes[0].GlobalDefault {
		t.Errorf("PriorityClass %s: value %d, globalDefault %v; want 1000000000, not the default", classes[0].Name, classes[0].Value, classes[0].GlobalDefault)
	}
	objs = render(t, "controller.priorityClassName=system-cluster-critical")
	pod = controllerDeployment(t, objs).Spec.Template.Spec
	if got := priorityClasses(t, objs); pod.PriorityClassName != "system-cluster-critical" || len(got) != 0 {
		t.Errorf("with a class named: pods' %q, PriorityClasses rendered %v; want the named one, none rendered", pod.PriorityClassName, got)
	}
}

func controllerDeployment(t *testing.T, objs []*unstructured.Unstructured) *appsv1.Deployment {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == "Deployment" && o.GetLabels()["app.kubernetes.io/component"] == "controller" {
			var d appsv1.Deployment
			convert(t, o, &d)
			return &d
		}
	}
	t.Fatal("no controller Deployment rendered")
	return nil
}

func controllerContainer(t *testing.T, d *appsv1.Deployment) *corev1.Container {
	t.Helper()
	for i := range d.Spec.Template.Spec.Containers {
		if c := &d.Spec.Template.Spec.Containers[i]; c.Name == "controller" {
			return c
		}
	}
	t.Fatal("no controller container")
	return nil
}

func priorityClasses(t *testing.T, objs []*unstructured.Unstructured) []schedulingv1.PriorityClass {
	t.Helper()
	var out []schedulingv1.PriorityClass
	for _, o := range objs {
		if o.GetKind() == "PriorityClass" {
			var pc schedulingv1.PriorityClass
			convert(t, o, &pc)
			out = append(out, pc)
		}
	}
	return out
}

func convert(t *testing.T, u *unstructured.Unstructured, into any) {
	t.Helper()
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, into); err != nil {
		t.Fatalf("%s %s: %v", u.GetKind(), u.GetName(), err)
	}
}

// render runs helm template with the given --set values and returns the
// objects.
func render(t *testing.T, sets ...string) []*unstructured.Unstructured {
	t.Helper()
	root := repoRoot(t)
	helm := filepath.Join(root, "_output", "bin", "helm")
	if _, err := os.Stat(helm); err != nil {
		if os.Getenv("E2E_REQUIRED") == "1" {
			t.Fatalf("helm not found at %s (E2E_REQUIRED=1): run hack/build-helm.sh", helm)
		}
		t.Skipf("helm not found at %s; run hack/build-helm.sh", helm)
	}
	home := t.TempDir()
	args := []string{"template", "chart", "deployments/helm/gpuaas-dra", "--namespace", "gpuaas-system", "--kube-version", "v1.37.2"}
	for _, s := range sets {
		args = append(args, "--set", s)
	}
	cmd := exec.Command(helm, args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "HELM_CONFIG_HOME="+home, "HELM_CACHE_HOME="+home, "HELM_DATA_HOME="+home,
		"KUBECONFIG="+filepath.Join(home, "none"))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	var objs []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(out), 4096)
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return objs
			}
			t.Fatalf("decoding the rendered chart: %v", err)
		}
		if len(m) > 0 {
			objs = append(objs, &unstructured.Unstructured{Object: m})
		}
	}
}

func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
}

// TestForeignClassesSkipTheWebhookFromTheFirstInstall (issue 52): the
// DeviceClasses the values name as other drivers' are in the claim
// webhooks' matchCondition as the chart renders it, so their claims skip
// the fail-closed webhook from the first install (and after helm upgrade
// --force), before the controller's leader computes the list; the
// condition is the controller's own, byte for byte, so its first sync
// rewrites only the list. Without such values the chart renders none.
func TestForeignClassesSkipTheWebhookFromTheFirstInstall(t *testing.T) {
	classes := []string{"nic.example.com", "fpga"}
	objs := render(t, "controller.webhook.foreignClasses={"+strings.Join(classes, ",")+"}")
	cfg := validatingConfig(t, objs)
	for _, name := range []string{"resourceclaims.quota.gpuaas.io", "resourceclaimtemplates.config.gpuaas.io"} {
		want, ok := webhook.ForeignMatchCondition(name, classes)
		if !ok {
			t.Fatalf("no condition for %s", name)
		}
		got := conditionsOf(t, cfg, name)
		if len(got) != 1 || got[0] != want {
			t.Errorf("%s: matchConditions %+v, want the controller's %+v", name, got, want)
		}
	}
	for _, name := range []string{"gpuprofiles.gpuaas.io", "tenantquotas.gpuaas.io"} {
		if got := conditionsOf(t, cfg, name); len(got) != 0 {
			t.Errorf("%s: matchConditions %+v, want none", name, got)
		}
	}
	cfg = validatingConfig(t, render(t))
	if got := conditionsOf(t, cfg, "resourceclaims.quota.gpuaas.io"); len(got) != 0 {
		t.Errorf("without foreignClasses: matchConditions %+v, want none", got)
	}
}

func validatingConfig(t *testing.T, objs []*unstructured.Unstructured) *admissionregv1.ValidatingWebhookConfiguration {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == "ValidatingWebhookConfiguration" {
			var cfg admissionregv1.ValidatingWebhookConfiguration
			convert(t, o, &cfg)
			return &cfg
		}
	}
	t.Fatal("no ValidatingWebhookConfiguration rendered")
	return nil
}

func conditionsOf(t *testing.T, cfg *admissionregv1.ValidatingWebhookConfiguration, name string) []admissionregv1.MatchCondition {
	t.Helper()
	for _, wh := range cfg.Webhooks {
		if wh.Name == name {
			return wh.MatchConditions
		}
	}
	t.Fatalf("no webhook %s rendered", name)
	return nil
}

// TestHardwareProfileNamespace (issue 54): controller.hardwareProfileNamespace
// passes --hardware-profile-namespace, controller.hardwareProfilesPerTenant
// --hardware-profiles-per-tenant, and either grants the controller's
// ClusterRole the HardwareProfiles it writes (and deletes where no longer
// meant) and the LocalQueues it reads; unset, neither.
func TestHardwareProfileNamespace(t *testing.T) {
	for _, tc := range []struct {
		sets      []string
		wantFlags []string
	}{
		{},
		{sets: []string{"controller.hardwareProfileNamespace=redhat-ods-applications"}, wantFlags: []string{"--hardware-profile-namespace=redhat-ods-applications"}},
		{sets: []string{"controller.hardwareProfilesPerTenant=true"}, wantFlags: []string{"--hardware-profiles-per-tenant"}},
	} {
		objs := render(t, tc.sets...)
		var flags []string
		for _, arg := range controllerContainer(t, controllerDeployment(t, objs)).Args {
			if strings.HasPrefix(arg, "--hardware-profile") {
				flags = append(flags, arg)
			}
		}
		granted := hardwareProfileVerbs(t, objs)
		queues := clusterRoleVerbs(t, objs, "kueue.x-k8s.io", "localqueues")
		if len(tc.wantFlags) == 0 {
			if len(flags) != 0 || granted != nil || queues != nil {
				t.Errorf("unset: flags %v, ClusterRole verbs on hardwareprofiles %v, on localqueues %v; want none", flags, granted, queues)
			}
			continue
		}
		if !slices.Equal(flags, tc.wantFlags) {
			t.Errorf("%v: flags %v, want %v", tc.sets, flags, tc.wantFlags)
		}
		for _, verb := range []string{"get", "list", "create", "update", "delete"} { // what the reconciler does
			if !slices.Contains(granted, verb) {
				t.Errorf("%v: ClusterRole verbs on hardwareprofiles %v lack %s", tc.sets, granted, verb)
			}
		}
		if !slices.Contains(queues, "list") {
			t.Errorf("%v: ClusterRole verbs on localqueues %v lack list", tc.sets, queues)
		}
	}
}

// clusterRoleVerbs are the verbs the chart's ClusterRoles grant on
// resource of group; nil: no rule names it.
func clusterRoleVerbs(t *testing.T, objs []*unstructured.Unstructured, group, resource string) []string {
	t.Helper()
	var verbs []string
	for _, o := range objs {
		if o.GetKind() != "ClusterRole" {
			continue
		}
		var role rbacv1.ClusterRole
		convert(t, o, &role)
		for _, rule := range role.Rules {
			if slices.Contains(rule.APIGroups, group) && slices.Contains(rule.Resources, resource) {
				verbs = append(verbs, rule.Verbs...)
			}
		}
	}
	return verbs
}

// hardwareProfileVerbs are the verbs the controller's ClusterRoles grant on
// infrastructure.opendatahub.io hardwareprofiles; nil: no rule names them.
func hardwareProfileVerbs(t *testing.T, objs []*unstructured.Unstructured) []string {
	t.Helper()
	return clusterRoleVerbs(t, objs, "infrastructure.opendatahub.io", "hardwareprofiles")
}
