package main

// The chart's monitoring mixin on the demo's real node: a real Prometheus
// (make prometheus) scrapes the plugin, the controller (over HTTPS, with a
// token bound to the chart's metrics-reader ClusterRole) and the API
// server, with the job labels the chart's PodMonitor and ServiceMonitor
// set, and loads the chart's rule file. It starts with the node, so that
// rates and alerts see the whole demo; at the end the demo prints where the
// dashboards and rules are and a few numbers read back through
// Prometheus's HTTP API.

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

const (
	monitoringDir       = "deployments/helm/gpuaas-dra/monitoring"
	monitoringRuleFile  = monitoringDir + "/rules/gpuaas-dra.rules.yaml"
	monitoringDashboard = monitoringDir + "/dashboards/gpuaas-dra-{tenant,fleet,operator}.json"
	// The jobs of the chart's PodMonitor and ServiceMonitor
	// (templates/monitoring-servicemonitors.yaml), which the rules and
	// dashboards select on, and kube-prometheus's job of the API server.
	promPluginJob     = "gpuaas-dra-kubelet-plugin"
	promControllerJob = "gpuaas-dra-controller"
	promAPIServerJob  = "apiserver"
	// promScraper is the ServiceAccount Prometheus scrapes the controller
	// as, bound to the chart's metrics-reader ClusterRole.
	promScraper = "demo-prometheus"
)

// startPrometheus starts Prometheus against the chart on the real node.
// It never fails the demo: what went wrong is kept for the report's one
// line.
func (d *demo) startPrometheus(ctx context.Context) {
	d.prom, d.promErr = d.startPrometheusErr(ctx)
}

func (d *demo) startPrometheusErr(ctx context.Context) (*framework.Prometheus, error) {
	if why := framework.PrometheusUnavailable(d.cp.BinDir); why != "" {
		return nil, errors.New(why)
	}
	root, err := framework.RepoRoot()
	if err != nil {
		return nil, err
	}
	pluginAddr, err := d.pluginMetricsAddr(ctx)
	if err != nil {
		return nil, err
	}
	pods, err := d.cp.ComponentPods(ctx, demoNamespace, "controller")
	if err != nil {
		return nil, err
	}
	if len(pods) != 1 {
		return nil, fmt.Errorf("%d controller pods, want 1", len(pods))
	}
	controllerPort := 0
	for _, p := range pods[0].Spec.Containers[0].Ports {
		if p.Name == "metrics" {
			controllerPort = int(p.ContainerPort)
		}
	}
	if controllerPort == 0 {
		return nil, fmt.Errorf("controller pod %s has no metrics port", pods[0].Name)
	}
	dir := filepath.Join(d.cp.Dir, "prometheus")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	token, err := d.scraperToken(ctx)
	if err != nil {
		return nil, err
	}
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(token), 0o600); err != nil {
		return nil, err
	}
	return d.cp.StartPrometheus(ctx, dir, framework.PrometheusOptions{
		RuleFiles: []string{filepath.Join(root, monitoringRuleFile)},
		Interval:  time.Second,
		Targets: []framework.ScrapeTarget{
			{Job: promPluginJob, Targets: []string{"127.0.0.1" + pluginAddr}, Labels: map[string]string{"node": d.opts.nodeName}},
			{Job: promControllerJob, Targets: []string{fmt.Sprintf("127.0.0.1:%d", controllerPort)}, HTTPS: true, BearerTokenFile: tokenFile},
			// The API server's /metrics is megabytes; the mixin reads its
			// admission webhook metrics only.
			{Job: promAPIServerJob, Targets: []string{strings.TrimPrefix(d.cp.Config.Host, "https://")}, HTTPS: true, BearerTokenFile: tokenFile,
				Interval: 5 * time.Second, Keep: "apiserver_admission_webhook_.*"},
		},
	})
}

// scraperToken creates promScraper, binds it to the chart's metrics-reader
// ClusterRole, and returns a token of it (a day long: --keep).
func (d *demo) scraperToken(ctx context.Context) (string, error) {
	c := d.cp.Client
	sa := &v1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: promScraper, Namespace: demoNamespace}}
	if _, err := c.CoreV1().ServiceAccounts(demoNamespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", err
	}
	role := demoRelease + "-gpuaas-dra-controller-metrics-reader"
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: promScraper + "-metrics-reader"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: promScraper, Namespace: demoNamespace}},
	}
	if _, err := c.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", err
	}
	tok, err := c.CoreV1().ServiceAccounts(demoNamespace).CreateToken(ctx, promScraper,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](24 * 3600)}}, metav1.CreateOptions{})
	if err != nil {
		return "", err
	}
	return tok.Status.Token, nil
}

// monitoringQueries are what the report reads back, by name.
var monitoringQueries = map[string]string{
	"posture":  "posture:gpuaas_gpu_posture:count",
	"used":     "max by (tenant) (gpuaas_tenant_gpu_units_used)",
	"reserved": "max by (tenant) (gpuaas_tenant_gpu_units_reserved)",
	"limit":    "max by (tenant) (gpuaas_tenant_gpu_units_limit)",
	"denials":  "sum by (tenant) (gpuaas_claim_denials_total)",
	// Over every prepare since the plugin started, not a 5m rate: the
	// demo's prepares are minutes old by now.
	"prepareP50": `histogram_quantile(0.5, sum by (le) (gpuaas_dra_plugin_claim_operation_duration_seconds_bucket{operation="prepare"}))`,
	"prepareP99": `histogram_quantile(0.99, sum by (le) (gpuaas_dra_plugin_claim_operation_duration_seconds_bucket{operation="prepare"}))`,
	// The buckets themselves: how many prepares there were (le="+Inf"),
	// and whether the p99 is only the largest finite bound.
	"prepareBuckets": `sum by (le) (gpuaas_dra_plugin_claim_operation_duration_seconds_bucket{operation="prepare"})`,
}

// monitoringReadings are what Prometheus answered.
type monitoringReadings struct {
	URL     string
	Keep    bool
	Targets []framework.Target
	// Results are the samples of monitoringQueries, by name; a query that
	// failed is in Errors instead.
	Results map[string][]framework.Sample
	Errors  map[string]error
	Alerts  []framework.Alert
	// AlertsErr is why the alerts could not be listed.
	AlertsErr error
}

// reportMonitoring prints where the mixin is and what Prometheus read.
func (d *demo) reportMonitoring(ctx context.Context) {
	d.out.printf("\nMonitoring: the chart's mixin under %s\n", monitoringDir)
	for _, line := range mixinLines() {
		d.out.printf("  %s\n", line)
	}
	switch {
	case d.real == nil:
		d.out.printf("  Prometheus: not run (it scrapes the chart on the real node; --node=real)\n")
		return
	case d.prom == nil:
		d.out.printf("  Prometheus: did not start (%s); logs in %s\n", firstLine(d.promErr), d.cp.LogDir)
		return
	}
	r := d.readPrometheus(ctx)
	for _, line := range monitoringLines(r) {
		d.out.printf("  %s\n", line)
	}
}

// mixinLines say where the dashboards and rules are and how to install them.
func mixinLines() []string {
	return []string{
		"dashboards " + monitoringDashboard + ": import into Grafana, or",
		"  --set monitoring.dashboards.enabled=true: ConfigMaps labelled grafana_dashboard=1 for Grafana's sidecar",
		"rules      " + monitoringRuleFile + " (its promtool tests: monitoring/tests), or",
		"  --set monitoring.rules.enabled=true: a PrometheusRule (monitoring.serviceMonitors.enabled: ServiceMonitor + PodMonitor)",
	}
}

// readPrometheus waits until every target was scraped and the rules ran,
// then reads monitoringQueries and the alerts.
func (d *demo) readPrometheus(ctx context.Context) monitoringReadings {
	r := monitoringReadings{URL: d.prom.URL, Keep: d.opts.keep,
		Results: map[string][]framework.Sample{}, Errors: map[string]error{}}
	// A couple of scrapes and rule evaluations after the last scenario.
	_ = wait.PollUntilContextTimeout(ctx, time.Second, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		targets, err := d.prom.Targets(ctx)
		if err != nil {
			return false, nil
		}
		r.Targets = targets
		posture, err := d.prom.Query(ctx, monitoringQueries["posture"])
		return err == nil && len(posture) > 0 && upTargets(targets) == len(targets), nil
	})
	select {
	case <-ctx.Done():
	case <-time.After(3 * time.Second):
	}
	for name, expr := range monitoringQueries {
		samples, err := d.prom.Query(ctx, expr)
		if err != nil {
			r.Errors[name] = err
			continue
		}
		r.Results[name] = samples
	}
	r.Alerts, r.AlertsErr = d.prom.Alerts(ctx)
	return r
}

func upTargets(targets []framework.Target) int {
	up := 0
	for _, t := range targets {
		if t.Health == "up" {
			up++
		}
	}
	return up
}

// monitoringLines formats what Prometheus answered, a line per number.
func monitoringLines(r monitoringReadings) []string {
	// Debian's binary serves the HTTP API (Grafana's data source) but not
	// the web UI, whose assets it leaves out.
	lifetime := "stops with the demo; DEMO_FLAGS=--keep keeps it"
	if r.Keep {
		lifetime = "up with the cluster until Ctrl-C"
	}
	lines := []string{
		fmt.Sprintf("Prometheus API %s (a Grafana data source; %s), the chart's rules loaded, reads:", r.URL, lifetime),
		fmt.Sprintf("  targets up       %d of %d (%s)", upTargets(r.Targets), len(r.Targets), targetJobs(r.Targets)),
	}
	row := func(label, name string, format func([]framework.Sample) string) {
		value := ""
		if err := r.Errors[name]; err != nil {
			value = "query failed: " + firstLine(err)
		} else if s := r.Results[name]; len(s) == 0 {
			value = "no data"
		} else {
			value = format(s)
		}
		lines = append(lines, fmt.Sprintf("  %-16s %s", label, value))
	}
	row("GPUs by posture", "posture", func(s []framework.Sample) string { return byLabel(s, "posture") })
	row("GPU units", "limit", func(limit []framework.Sample) string { return tenantUnits(r.Results, limit) })
	row("quota denials", "denials", func(s []framework.Sample) string { return byLabel(s, "tenant") })
	row("prepare latency", "prepareBuckets", func(buckets []framework.Sample) string {
		return prepareLatency(first(r.Results["prepareP50"]), first(r.Results["prepareP99"]), buckets)
	})
	lines = append(lines, "  alerts           "+alertSummary(r.Alerts, r.AlertsErr))
	return lines
}

// prepareLatency is the p50 and p99 of the prepares and how many there
// were. histogram_quantile answers the largest finite bound for a quantile
// beyond it: that p99 is shown as a lower bound, with how many prepares
// took longer.
func prepareLatency(p50, p99 string, buckets []framework.Sample) string {
	total, top, topCount := math.NaN(), math.Inf(-1), 0.0
	for _, b := range buckets {
		le, errLe := strconv.ParseFloat(b.Metric["le"], 64)
		n, errN := strconv.ParseFloat(b.Value, 64)
		switch {
		case errLe != nil || errN != nil:
		case math.IsInf(le, 1):
			total = n
		case le > top:
			top, topCount = le, n
		}
	}
	p99Text := seconds(p99)
	var beyond string
	if v, err := strconv.ParseFloat(p99, 64); err == nil && total > topCount && !math.IsInf(top, -1) {
		if v >= top {
			p99Text = ">= " + p99Text
		}
		beyond = fmt.Sprintf(" (%s over %s)", number(strconv.FormatFloat(total-topCount, 'f', -1, 64)), seconds(strconv.FormatFloat(top, 'f', -1, 64)))
	}
	return fmt.Sprintf("p50 %s, p99 %s over %s prepares%s", seconds(p50), p99Text, number(strconv.FormatFloat(total, 'f', -1, 64)), beyond)
}

// targetJobs lists the targets' jobs and their health where not up.
func targetJobs(targets []framework.Target) string {
	jobs := make([]string, 0, len(targets))
	for _, t := range targets {
		job := t.Job
		if t.Health != "up" {
			job += " " + t.Health
			if t.LastError != "" {
				job += ": " + t.LastError
			}
		}
		jobs = append(jobs, job)
	}
	sort.Strings(jobs)
	return strings.Join(jobs, ", ")
}

// byLabel is "a 1, b 2", the samples by one label's values, sorted.
func byLabel(samples []framework.Sample, label string) string {
	parts := make([]string, 0, len(samples))
	for _, s := range samples {
		parts = append(parts, s.Metric[label]+" "+number(s.Value))
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}

// tenantUnits is each tenant's used and reserved GPU units against its limit.
func tenantUnits(results map[string][]framework.Sample, limits []framework.Sample) string {
	byTenant := func(name string) map[string]string {
		m := map[string]string{}
		for _, s := range results[name] {
			m[s.Metric["tenant"]] = s.Value
		}
		return m
	}
	used, reserved := byTenant("used"), byTenant("reserved")
	parts := make([]string, 0, len(limits))
	for _, l := range limits {
		t := l.Metric["tenant"]
		parts = append(parts, fmt.Sprintf("%s %s+%s/%s", t, number(used[t]), number(reserved[t]), number(l.Value)))
	}
	sort.Strings(parts)
	return "used+reserved/limit " + strings.Join(parts, ", ")
}

// alertSummary is the active alerts, firing first, with their distinguishing labels.
func alertSummary(alerts []framework.Alert, err error) string {
	if err != nil {
		return "could not be listed: " + firstLine(err)
	}
	byState := map[string][]string{}
	for _, a := range alerts {
		var labels []string
		for k, v := range a.Labels {
			switch k {
			case "alertname", "severity", "job", "instance":
			default:
				labels = append(labels, k+"="+v)
			}
		}
		sort.Strings(labels)
		name := a.Labels["alertname"]
		if len(labels) > 0 {
			name += "{" + strings.Join(labels, ",") + "}"
		}
		byState[a.State] = append(byState[a.State], name)
	}
	var parts []string
	for _, state := range []string{"firing", "pending"} {
		names := byState[state]
		sort.Strings(names)
		if len(names) == 0 {
			names = []string{"none"}
		}
		parts = append(parts, state+": "+strings.Join(names, ", "))
	}
	return strings.Join(parts, "; ")
}

func first(samples []framework.Sample) string {
	if len(samples) == 0 {
		return "?"
	}
	return samples[0].Value
}

// number is a sample's value: a whole number as it is, a fraction in three
// significant digits.
func number(value string) string {
	v, err := strconv.ParseFloat(value, 64)
	switch {
	case value == "":
		return "?"
	case err != nil:
		return value
	case v == math.Trunc(v) && math.Abs(v) < 1e15:
		return strconv.FormatFloat(v, 'f', -1, 64)
	default:
		return strconv.FormatFloat(v, 'g', 3, 64)
	}
}

// seconds is a latency in seconds as ms or s.
func seconds(value string) string {
	v, err := strconv.ParseFloat(value, 64)
	switch {
	case err != nil || math.IsNaN(v):
		return "n/a"
	case math.IsInf(v, 0):
		return "above the largest bucket"
	case v < 1:
		return strconv.FormatFloat(v*1000, 'f', 1, 64) + "ms"
	default:
		return strconv.FormatFloat(v, 'f', 2, 64) + "s"
	}
}

// pluginMetricsAddr is the chart's plugin pod's METRICS_ADDR, ":<port>" on
// the host network.
func (d *demo) pluginMetricsAddr(ctx context.Context) (string, error) {
	plugin, err := d.cp.WaitForPluginPod(ctx, demoNamespace, "")
	if err != nil {
		return "", err
	}
	addr := ""
	for _, e := range plugin.Spec.Containers[0].Env {
		if e.Name == "METRICS_ADDR" {
			addr = e.Value
		}
	}
	if !strings.HasPrefix(addr, ":") {
		return "", fmt.Errorf("plugin pod %s: METRICS_ADDR %q, want :<port>", plugin.Name, addr)
	}
	return addr, nil
}
