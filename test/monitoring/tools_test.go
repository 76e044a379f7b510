package monitoring

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// tool returns a binary built into _output/bin by a hack/ script. Without
// it the test skips with the reason, except under E2E_REQUIRED=1 (make
// test), where a missing tool is a failure: these checks are never skipped
// in CI.
func tool(t *testing.T, name, script string) string {
	t.Helper()
	bin := filepath.Join(repoRoot(t), "_output", "bin", name)
	if _, err := os.Stat(bin); err != nil {
		if os.Getenv("E2E_REQUIRED") == "1" {
			t.Fatalf("%s not found at %s (E2E_REQUIRED=1): run %s", name, bin, script)
		}
		t.Skipf("%s not found at %s; run %s", name, bin, script)
	}
	return bin
}

func run(t *testing.T, dir, bin string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestPromtoolCheckRules: promtool parses every rule file (PromQL syntax,
// templates of annotations, duplicate names).
func TestPromtoolCheckRules(t *testing.T) {
	promtool := tool(t, "promtool", "hack/build-prometheus.sh (make prometheus)")
	paths, _ := filepath.Glob(mixinPath(t, "rules", "*.yaml"))
	out, err := run(t, repoRoot(t), promtool, append([]string{"check", "rules"}, paths...)...)
	if err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
	t.Log(strings.TrimSpace(out))
}

// TestPromtoolTestRules: the promtool unit tests of every alert (and of
// the recording rules they build on) pass.
func TestPromtoolTestRules(t *testing.T) {
	promtool := tool(t, "promtool", "hack/build-prometheus.sh (make prometheus)")
	paths, _ := filepath.Glob(mixinPath(t, "tests", "*.yaml"))
	if len(paths) == 0 {
		t.Fatalf("no promtool tests under %s", mixinPath(t, "tests"))
	}
	out, err := run(t, repoRoot(t), promtool, append([]string{"test", "rules"}, paths...)...)
	if err != nil {
		t.Fatalf("promtool test rules: %v\n%s", err, out)
	}
	t.Log(strings.TrimSpace(out))
}

// renderChart runs helm template with the given --set values and returns
// the objects.
func renderChart(t *testing.T, sets ...string) []*unstructured.Unstructured {
	t.Helper()
	helm := tool(t, "helm", "hack/build-helm.sh (make helm)")
	home := t.TempDir()
	args := []string{"template", "mon", "deployments/helm/gpuaas-dra", "--namespace", "gpu-system", "--kube-version", "v1.37.2"}
	for _, s := range sets {
		args = append(args, "--set", s)
	}
	cmd := exec.Command(helm, args...)
	cmd.Dir = repoRoot(t)
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
				break
			}
			t.Fatalf("decoding the rendered chart: %v", err)
		}
		if len(m) == 0 {
			continue
		}
		u := &unstructured.Unstructured{Object: m}
		if u.GetAPIVersion() == "" || u.GetKind() == "" || u.GetName() == "" {
			t.Fatalf("rendered object without apiVersion, kind or name: %v", m)
		}
		objs = append(objs, u)
	}
	return objs
}

func byKind(objs []*unstructured.Unstructured, kind string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == kind {
			out = append(out, o)
		}
	}
	return out
}

var monitoringOn = []string{"monitoring.dashboards.enabled=true", "monitoring.rules.enabled=true",
	"monitoring.serviceMonitors.enabled=true", "monitoring.rules.labels.release=kps",
	"monitoring.serviceMonitors.labels.release=kps"}

// TestHelmMonitoringOffByDefault: a plain install renders no monitoring
// object (the cluster may have no Prometheus Operator CRDs).
func TestHelmMonitoringOffByDefault(t *testing.T) {
	for _, o := range renderChart(t) {
		if strings.HasPrefix(o.GetAPIVersion(), "monitoring.coreos.com/") || o.GetLabels()["grafana_dashboard"] != "" {
			t.Errorf("rendered %s %s with monitoring off", o.GetKind(), o.GetName())
		}
	}
}

// TestHelmMonitoringRenders: with monitoring on, the chart renders one
// dashboard ConfigMap per dashboard file (verbatim, with the sidecar's
// label), a PrometheusRule whose groups are the rule file's, and scrape
// objects that select the chart's own controller Service and plugin pods
// by labels and port names that exist, and set the job labels the mixin
// queries use.
func TestHelmMonitoringRenders(t *testing.T) {
	for _, hostNetwork := range []bool{false, true} {
		name := "pod-network"
		if hostNetwork {
			name = "host-network"
		}
		t.Run(name, func(t *testing.T) {
			sets := append([]string{}, monitoringOn...)
			if hostNetwork {
				sets = append(sets, "kubeletPlugin.hostNetwork=true")
			}
			objs := renderChart(t, sets...)
			checkDashboardConfigMaps(t, objs)
			checkPrometheusRule(t, objs)
			checkMonitors(t, objs, hostNetwork)
		})
	}
}

func checkDashboardConfigMaps(t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
	files := loadDashboards(t)
	seen := map[string]bool{}
	for _, cm := range byKind(objs, "ConfigMap") {
		if cm.GetLabels()["grafana_dashboard"] != "1" {
			continue
		}
		data, _, _ := unstructured.NestedStringMap(cm.Object, "data")
		for file, content := range data {
			want, err := os.ReadFile(mixinPath(t, "dashboards", file))
			if err != nil {
				t.Errorf("ConfigMap %s holds %s, which is no dashboard file", cm.GetName(), file)
				continue
			}
			if content != strings.TrimRight(string(want), "\n") {
				t.Errorf("ConfigMap %s: %s differs from the file", cm.GetName(), file)
			}
			if !json.Valid([]byte(content)) {
				t.Errorf("ConfigMap %s: %s is not JSON", cm.GetName(), file)
			}
			seen[file] = true
		}
	}
	for _, d := range files {
		if !seen[d.File] {
			t.Errorf("no dashboard ConfigMap holds %s", d.File)
		}
	}
}

func checkPrometheusRule(t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
	prs := byKind(objs, "PrometheusRule")
	if len(prs) != 1 {
		t.Fatalf("want one PrometheusRule, got %d", len(prs))
	}
	pr := prs[0]
	if pr.GetAPIVersion() != "monitoring.coreos.com/v1" || pr.GetLabels()["release"] != "kps" {
		t.Errorf("PrometheusRule %s: apiVersion %s, labels %v", pr.GetName(), pr.GetAPIVersion(), pr.GetLabels())
	}
	groups, _, _ := unstructured.NestedSlice(pr.Object, "spec", "groups")
	files, _ := loadRules(t)
	var want []any
	for file := range files {
		data, err := os.ReadFile(mixinPath(t, "rules", file))
		if err != nil {
			t.Fatal(err)
		}
		var f map[string]any
		if err := yaml.Unmarshal(data, &f); err != nil {
			t.Fatal(err)
		}
		want = append(want, f["groups"].([]any)...)
	}
	if !reflect.DeepEqual(groups, want) {
		t.Errorf("the PrometheusRule's groups differ from the rule files")
	}
	// The rendered rules are what promtool checks, when it is here.
	if _, err := os.Stat(filepath.Join(repoRoot(t), "_output", "bin", "promtool")); err == nil {
		data, err := yaml.Marshal(map[string]any{"groups": groups})
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(t.TempDir(), "rendered.rules.yaml")
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		if out, err := run(t, repoRoot(t), filepath.Join(repoRoot(t), "_output", "bin", "promtool"), "check", "rules", path); err != nil {
			t.Errorf("promtool check rules on the rendered PrometheusRule: %v\n%s", err, out)
		}
	}
}

// checkMonitors checks the ServiceMonitor and PodMonitor against the
// objects they scrape.
func checkMonitors(t *testing.T, objs []*unstructured.Unstructured, hostNetwork bool) {
	t.Helper()
	jobs := map[string]bool{}
	// The controller: a ServiceMonitor selecting the metrics Service by its
	// labels, through a port the Service names, over HTTPS (metricsSecure
	// is on by default).
	sel, ep := onlyMonitor(t, objs, "ServiceMonitor", "endpoints")
	var ports []string
	for _, svc := range byKind(objs, "Service") {
		if matches(sel, svc.GetLabels()) {
			sp, _, _ := unstructured.NestedSlice(svc.Object, "spec", "ports")
			for _, p := range sp {
				ports = append(ports, p.(map[string]any)["name"].(string))
			}
		}
	}
	if !contains(ports, ep["port"].(string)) {
		t.Errorf("ServiceMonitor port %v is not a port of the Services it selects (%v)", ep["port"], ports)
	}
	if ep["scheme"] != "https" || ep["bearerTokenFile"] == nil {
		t.Errorf("ServiceMonitor endpoint %v: want https with the ServiceAccount token (controller.metricsSecure)", ep)
	}
	collectJobs(t, ep, jobs)
	checkPodMonitor(t, objs, hostNetwork, jobs)
	// Every job the mixin's queries name is one these objects set.
	_, rules := loadRules(t)
	for _, q := range mixinQueries(t, rules, loadDashboards(t)) {
		names, _ := parseNames(q.expr)
		for _, s := range names.selectors {
			if j, ok := s.labels["job"]; ok && !strings.ContainsAny(j, ".*|") && !jobs[j] {
				t.Errorf("%s selects job %q, which no rendered monitor sets (%v)", q.where, j, jobs)
			}
		}
	}
}

func checkPodMonitor(t *testing.T, objs []*unstructured.Unstructured, hostNetwork bool, jobs map[string]bool) {
	t.Helper()
	sel, ep := onlyMonitor(t, objs, "PodMonitor", "podMetricsEndpoints")
	found := false
	for _, ds := range byKind(objs, "DaemonSet") {
		labels, _, _ := unstructured.NestedStringMap(ds.Object, "spec", "template", "metadata", "labels")
		if !matches(sel, labels) {
			continue
		}
		found = true
		containers, _, _ := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", "containers")
		var ports []string
		for _, c := range containers {
			cp, _, _ := unstructured.NestedSlice(c.(map[string]any), "ports")
			for _, p := range cp {
				ports = append(ports, p.(map[string]any)["name"].(string))
			}
		}
		port, _ := ep["port"].(string)
		switch {
		case hostNetwork && port != "":
			t.Errorf("PodMonitor names port %q, but on the host network the plugin declares none", port)
		case !hostNetwork && !contains(ports, port):
			t.Errorf("PodMonitor port %q is not a port of the plugin's containers (%v)", port, ports)
		}
	}
	if !found {
		t.Errorf("the PodMonitor's selector %v matches no DaemonSet's pods", sel)
	}
	relabel := collectJobs(t, ep, jobs)
	if !contains(relabel, "node") {
		t.Errorf("the PodMonitor does not set the node label the rules group plugins by")
	}
	checkHonorLabels(t, ep)
}

// podTargetLabels are the target labels the Prometheus Operator gives
// every series a PodMonitor scrapes: the scraped pod's namespace, name and
// container.
var podTargetLabels = []string{"namespace", "pod", "container"}

// checkHonorLabels: where a plugin metric has a label of its own that the
// operator also sets as a target label (the per-claim use metrics'
// namespace and pod: the claim's, not the plugin's), the PodMonitor must
// honor the scraped labels; otherwise Prometheus renames them
// exported_namespace and exported_pod, and every query by a claim's
// namespace or pod (the tenant dashboard, an autoscaler) reads the
// plugin's own.
func checkHonorLabels(t *testing.T, ep map[string]any) {
	t.Helper()
	var clashing []string
	for name, m := range registryInventory() {
		for _, l := range podTargetLabels {
			if m.labels[l] {
				clashing = append(clashing, name+"{"+l+"}")
			}
		}
	}
	sort.Strings(clashing)
	if len(clashing) > 0 && ep["honorLabels"] != true {
		t.Errorf("the PodMonitor does not set honorLabels, but the plugin's metrics have labels the operator sets on its targets: %s", strings.Join(clashing, ", "))
	}
}

// onlyMonitor is the selector and the endpoint of the one monitor of kind
// (ServiceMonitor, PodMonitor) the chart renders, whose endpoints are
// under spec.<endpoints>; more than one of either fails the test.
func onlyMonitor(t *testing.T, objs []*unstructured.Unstructured, kind, endpoints string) (map[string]string, map[string]any) {
	t.Helper()
	monitors := byKind(objs, kind)
	if len(monitors) != 1 {
		t.Fatalf("want one %s, got %d", kind, len(monitors))
	}
	m := monitors[0]
	sel, _, _ := unstructured.NestedStringMap(m.Object, "spec", "selector", "matchLabels")
	eps, _, _ := unstructured.NestedSlice(m.Object, "spec", endpoints)
	if len(eps) != 1 {
		t.Fatalf("%s: want one endpoint, got %d", kind, len(eps))
	}
	return sel, eps[0].(map[string]any)
}

// collectJobs records the job labels an endpoint's relabelings set and
// returns every target label it writes.
func collectJobs(t *testing.T, ep map[string]any, jobs map[string]bool) []string {
	t.Helper()
	var targets []string
	rl, _ := ep["relabelings"].([]any)
	for _, r := range rl {
		m := r.(map[string]any)
		target, _ := m["targetLabel"].(string)
		targets = append(targets, target)
		if target == "job" {
			jobs[m["replacement"].(string)] = true
		}
	}
	sort.Strings(targets)
	return targets
}

func matches(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
