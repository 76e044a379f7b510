package e2e

// The chart's monitoring mixin against a real Prometheus: on the real node,
// Prometheus scrapes what `helm install` deployed (the plugin, the
// controller with the chart's metrics authorization) and the API server,
// with the job labels the chart's ServiceMonitor/PodMonitor give, and
// loads the chart's rule file. A scenario like the demo's (a tenant at its
// limit, an XID, claims prepared and unprepared) runs, and then every
// dashboard panel query and every rule expression is evaluated through
// Prometheus's HTTP API: a panel that says "No data" on a running demo, or
// a rule over a metric nobody exports, fails the test.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/yaml"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev/nvmock"
	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
	"github.com/gpuaas/gpu-dra-driver/test/monitoring/mixin"
)

const (
	// The jobs the chart's ServiceMonitor and PodMonitor set
	// (templates/monitoring-servicemonitors.yaml), and kube-prometheus's
	// job of the API server.
	pluginJob     = "gpuaas-dra-kubelet-plugin"
	controllerJob = "gpuaas-dra-controller"
	apiserverJob  = "apiserver"
	// xidGPU is the whole GPU the scenario's XID hits (0-3 are whole GPUs
	// in demo/node-config.yaml; the scenario's claims land elsewhere or are
	// gone by then).
	xidGPU = 3
	// Grafana's $__rate_interval and $__range, fixed: a minute holds 60
	// samples at the 1 s scrape interval, and an hour covers the whole run.
	rateInterval = "1m"
	rangeWindow  = "1h"
	// queryPatience is how long a query may take to return data: rates need
	// two samples, and recording rules feed rules and panels a few
	// evaluation rounds later.
	queryPatience = 90 * time.Second
)

var tenantQuotaGVR = schema.GroupVersionResource{Group: "gpuaas.io", Version: "v1alpha1", Resource: "tenantquotas"}

// firingInScenario are the alerts the scenario must set off, with the
// labels they must carry: pending as the chart ships them (their `for` is
// minutes long), firing in a copy without `for`. Every other alert must
// stay inactive in both.
var firingInScenario = map[string]map[string]string{
	"GpuaasGPUUnhealthy":  {"node": realNodeName, "gpu": fmt.Sprint(xidGPU)},
	"GpuaasTenantAtLimit": {"tenant": "team-a", "resource": "gpuUnits"},
	// team-a's budget cut to a thousandth (spendBudgetInSeconds): its
	// GPUs spend it in seconds, past each threshold.
	"GpuaasTenantBudgetThresholdReached": {"tenant": "team-a"},
	"GpuaasTenantBudgetExhausted":        {"tenant": "team-a"},
}

// stateLabels select a series by the state it reports (a GPU's posture,
// an operation's result, why a webhook call failed). The check that each
// selector of a query names series that exist drops them: the alert over
// `posture="CleanupBlocked"` is meant to be empty here, but
// gpuaas_gpu_posture must exist.
var stateLabels = map[string]bool{"posture": true, "result": true, "error_type": true}

// witnessExemptions are the selectors (state matchers dropped) allowed to
// select nothing in the scenario, and why. Keep it short: a selector here
// is one whose metric name nothing in this test proves right (test/monitoring
// still checks it against the API server's registered metrics).
var witnessExemptions = map[string]string{
	// The API server creates this series only when it could not call a
	// webhook with failurePolicy Ignore and let the request through.
	// Making that happen would set off GpuaasWebhookFailingOpen, which the
	// scenario must keep quiet (its window is 5m, longer than this test
	// should wait for it to clear again).
	`apiserver_admission_webhook_fail_open_count{name=~".*[.]gpuaas[.]io"}`: "only exists after a fail-open webhook call",
	// The plugin sets a series only for a GPU it could not read at
	// start (TestLostGPUDoesNotTakeTheNodeDown covers that path); a GPU
	// lost here would need the chart's plugin restarted mid-scenario.
	`gpuaas_dra_plugin_gpu_problems{job="gpuaas-dra-kubelet-plugin", reason!="unknown-attribute"}`: "only exists for a GPU the plugin could not read at start",
}

// TestRealNodePrometheus: Prometheus scrapes the chart on the real node and
// every panel of the chart's dashboards and every rule of its rule file
// returns data; the alerts the scenario sets off (an unhealthy GPU, a
// tenant at its limit) fire and no other does; a copy of the rules with a
// metric renamed fails the same check.
func TestRealNodePrometheus(t *testing.T) {
	recapFailures(t)
	requireRealNode(t)
	requirePrometheus(t)
	n := startRealNode(t)
	installChartForTest(t, n)
	ctx := framework.Context(t, 15*time.Minute)
	prom := startChartPrometheus(t, ctx, n)
	runMonitoringScenario(t, n, prom)

	rules := loadMixinRules(t, filepath.Join(repoRoot, mixin.Dir, mixin.RuleFile))
	queries := append(loadDashboardQueries(t), ruleQueries(rules)...)
	results := evaluateAll(t, ctx, prom, queries)
	var b strings.Builder
	counts := map[string]int{}
	for _, r := range results {
		counts[r.kind]++
		fmt.Fprintf(&b, "  %-8s %-75s %3d series; selectors: %v\n", r.kind, r.where, r.size, r.witnesses)
	}
	t.Logf("evaluated %d queries (%v) through Prometheus's API:\n%s", len(results), counts, b.String())
	for _, r := range results {
		if r.problem != "" {
			recapErrorf(t, "%s %s: %s", r.kind, r.where, r.problem)
		}
	}
	checkRuleHealth(t, ctx, prom)
	checkAlerts(t, ctx, prom, rules)

	// The check is only worth something if it catches a rule gone wrong:
	// a copy of the rule file with a metric renamed, as a refactoring that
	// forgot the mixin would leave it, must fail it.
	t.Run("RenamedMetricFails", func(t *testing.T) {
		data, err := os.ReadFile(filepath.Join(repoRoot, mixin.Dir, mixin.RuleFile))
		if err != nil {
			recapFatalf(t, "%v", err)
		}
		const from, to = "gpuaas_claim_denials_total", "gpuaas_claim_denied_total"
		copyPath := filepath.Join(t.TempDir(), "renamed.rules.yaml")
		if err := os.WriteFile(copyPath, []byte(strings.ReplaceAll(string(data), from, to)), 0o600); err != nil {
			recapFatalf(t, "%v", err)
		}
		var failed []string
		for _, q := range ruleQueries(loadMixinRules(t, copyPath)) {
			if !strings.Contains(q.expr, to) {
				continue
			}
			// The same check as above, once: with the metric renamed the
			// expression and its selector are empty.
			r := evaluateQuick(ctx, prom, q, !q.quietAlert())
			t.Logf("%s %s with %s renamed to %s: %d series, problem: %q", r.kind, r.where, from, to, r.size, r.problem)
			if r.problem != "" {
				failed = append(failed, r.where)
			}
		}
		want := []string{"alert GpuaasTenantAtLimit", "record tenant:gpuaas_claim_denials:rate5m"}
		sort.Strings(failed)
		if strings.Join(failed, ",") != strings.Join(want, ",") {
			recapErrorf(t, "with %s renamed the check failed %v, want %v", from, failed, want)
		}

		// A panel that falls back to `or on () vector(0)` never says "No
		// data"; its selectors are what catch a renamed metric there.
		const panelFrom, panelTo = "gpuaas_dra_plugin_device_faults", "gpuaas_dra_plugin_device_fault"
		found := false
		for _, q := range loadDashboardQueries(t) {
			if !strings.Contains(q.expr, panelFrom) || !strings.Contains(q.expr, "vector(0)") {
				continue
			}
			found = true
			q.expr = strings.ReplaceAll(q.expr, panelFrom, panelTo)
			r := evaluateQuick(ctx, prom, q, true)
			t.Logf("%s %s with %s renamed to %s: %d series, problem: %q", r.kind, r.where, panelFrom, panelTo, r.size, r.problem)
			if r.size == 0 || !strings.Contains(r.problem, "selector "+panelTo) {
				recapErrorf(t, "panel %s with %s renamed: %d series, problem %q; want the vector(0) fallback and a selector that selects nothing", q.where, panelFrom, r.size, r.problem)
			}
		}
		if !found {
			recapErrorf(t, "no panel reads %s with a vector(0) fallback any more; pick another for this check", panelFrom)
		}
	})
}

// requirePrometheus skips (fails under E2E_REQUIRED=1) without the pinned
// Prometheus; the suite's setup already fails then under E2E_REQUIRED=1.
func requirePrometheus(t *testing.T) {
	t.Helper()
	if why := framework.PrometheusUnavailable(cp.BinDir); why != "" {
		if framework.Required() {
			recapFatalf(t, "%s (E2E_REQUIRED=1)", why)
		}
		t.Skip(why)
	}
}

// installChartForTest installs the chart on the test's own real node and
// uninstalls it when the test ends (after what the test created later),
// so that the next real-node test installs it afresh. Edits change the
// values first.
// reclaimAfterForTest is the chart's controller.reclaimUnallocatedAfter in
// the tests that install it with installChartForTest.
const reclaimAfterForTest = "5s"

func installChartForTest(t *testing.T, n *realNode, edits ...func(values string) string) {
	t.Helper()
	ctx := framework.Context(t, 6*time.Minute)
	values, err := n.ChartValues(2)
	if err != nil {
		recapFatalf(t, "%v", err)
	}
	for _, edit := range edits {
		values = edit(values)
	}
	// Short, so the monitoring scenario can show a lender reclaiming.
	values = strings.Replace(values, "\ncontroller:\n", "\ncontroller:\n  reclaimUnallocatedAfter: "+reclaimAfterForTest+"\n", 1)
	n.values = values
	uninstallOnCleanup(t, ctx, helmBin(t))
	if err := n.InstallChart(ctx, helmBin(t), releaseName, releaseNamespace, values); err != nil {
		recapFatalf(t, "%v", err)
	}
	if _, err := n.WaitForDevices(ctx, 8); err != nil {
		recapFatalf(t, "%v", err)
	}
}

// startChartPrometheus starts Prometheus scraping the release's plugin
// (plain HTTP, with the node label the PodMonitor adds), its controller
// (HTTPS with a token of a ServiceAccount bound to the chart's
// metrics-reader ClusterRole, as the ServiceMonitor documents) and the API
// server (the same token: the role grants get on /metrics, which the API
// server authorizes too), and waits until every target is up.
func startChartPrometheus(t *testing.T, ctx context.Context, n *realNode) *framework.Prometheus {
	plugin := waitForPluginPod(t, ctx, "")
	pluginAddr := ""
	for _, e := range plugin.Spec.Containers[0].Env {
		if e.Name == "METRICS_ADDR" {
			pluginAddr = e.Value
		}
	}
	if !strings.HasPrefix(pluginAddr, ":") {
		recapFatalf(t, "plugin pod %s: METRICS_ADDR %q, want :<port>", plugin.Name, pluginAddr)
	}
	controller := chartControllerReplica(t, ctx)
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(serviceAccountToken(t, ctx, scraperAccount, metricsReaderRole)), 0o600); err != nil {
		recapFatalf(t, "%v", err)
	}
	rules := filepath.Join(repoRoot, mixin.Dir, mixin.RuleFile)
	prom, err := cp.StartPrometheus(ctx, dir, framework.PrometheusOptions{
		RuleFiles: []string{rules, immediateAlerts(t, rules, dir)},
		Interval:  time.Second,
		Targets: []framework.ScrapeTarget{
			{Job: pluginJob, Targets: []string{"127.0.0.1" + pluginAddr}, Labels: map[string]string{"node": n.Name}},
			{Job: controllerJob, Targets: []string{fmt.Sprintf("127.0.0.1:%d", controller.metricsPort)}, HTTPS: true, BearerTokenFile: tokenFile},
			// The API server's /metrics is megabytes; the mixin reads its
			// admission webhook metrics only.
			{Job: apiserverJob, Targets: []string{strings.TrimPrefix(cp.Config.Host, "https://")}, HTTPS: true, BearerTokenFile: tokenFile,
				Interval: 5 * time.Second, Keep: "apiserver_admission_webhook_.*"},
		},
	})
	if err != nil {
		recapFatalf(t, "%v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("prometheus log %s:\n%s", prom.Process.LogPath, prom.Process.Tail(20))
		}
		if err := prom.Stop(); err != nil {
			recapErrorf(t, "stopping prometheus: %v", err)
		}
	})
	var last []framework.Target
	err = wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		var err error
		if last, err = prom.Targets(ctx); err != nil {
			return false, err
		}
		up := 0
		for _, tg := range last {
			if tg.Health == "up" {
				up++
			}
		}
		return up == 3 && len(last) == 3, nil
	})
	if err != nil {
		recapFatalf(t, "Prometheus targets not all up: %v: %+v", err, last)
	}
	for _, tg := range last {
		t.Logf("scraping job %s at %s: %s", tg.Job, tg.URL, tg.Health)
	}
	return prom
}

// immediateLabel marks the alerts of the rule file's copy without `for`.
const immediateLabel = "gpuaas_e2e_copy"

// immediateAlerts writes a copy of the rule file's alerting rules without
// their `for` (10 minutes and more: longer than the test) and with
// immediateLabel, so that an alert whose expression holds fires during the
// test, next to the original that is pending. Recording rules are left out:
// the original records them.
func immediateAlerts(t *testing.T, rules, dir string) string {
	t.Helper()
	data, err := os.ReadFile(rules)
	if err != nil {
		recapFatalf(t, "%v", err)
	}
	var file struct {
		Groups []struct {
			Name  string           `json:"name"`
			Rules []map[string]any `json:"rules"`
		} `json:"groups"`
	}
	if err := yaml.Unmarshal(data, &file); err != nil {
		recapFatalf(t, "%s: %v", rules, err)
	}
	type group struct {
		Name  string           `json:"name"`
		Rules []map[string]any `json:"rules"`
	}
	var out struct {
		Groups []group `json:"groups"`
	}
	for _, g := range file.Groups {
		ng := group{Name: g.Name + "-immediate"}
		for _, r := range g.Rules {
			if _, ok := r["alert"]; !ok {
				continue
			}
			delete(r, "for")
			labels, _ := r["labels"].(map[string]any)
			if labels == nil {
				labels = map[string]any{}
			}
			labels[immediateLabel] = "for-0s"
			r["labels"] = labels
			ng.Rules = append(ng.Rules, r)
		}
		if len(ng.Rules) > 0 {
			out.Groups = append(out.Groups, ng)
		}
	}
	copyData, err := yaml.Marshal(out)
	if err != nil {
		recapFatalf(t, "%v", err)
	}
	path := filepath.Join(dir, "alerts-for-0s.rules.yaml")
	if err := os.WriteFile(path, copyData, 0o600); err != nil {
		recapFatalf(t, "%v", err)
	}
	return path
}

// createMonitoredShape gives the fleet dashboard's shape panel a series: a
// GpuShape of one h100 (the quota demo's profile) for team-a.
func createMonitoredShape(t *testing.T, ctx context.Context) {
	t.Helper()
	gvr := schema.GroupVersionResource{Group: "gpuaas.io", Version: "v1alpha1", Resource: "gpushapes"}
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "gpuaas.io/v1alpha1", "kind": "GpuShape",
		"metadata": map[string]any{"name": "prom-slot"},
		"spec": map[string]any{
			"requests": []any{map[string]any{"name": "gpu", "profile": "h100"}},
			"tenants":  []any{"team-a"},
		},
	}}
	if _, err := cp.Dynamic.Resource(gvr).Create(ctx, obj, metav1.CreateOptions{}); err != nil {
		recapFatalf(t, "creating GpuShape prom-slot: %v", err)
	}
	t.Cleanup(func() {
		_ = cp.Dynamic.Resource(gvr).Delete(context.WithoutCancel(ctx), "prom-slot", metav1.DeleteOptions{})
	})
}

// runMonitoringScenario gives every panel something to show: the demo's
// quota scenario (tenants in a cohort, a claim whose alternative is
// dropped, one borrowing, one denied, a pod running on a MIG slice), a
// second denial once Prometheus saw the first (an alert on increase()
// needs the counter to rise while scraped), a whole-GPU pod prepared and
// unprepared, and a reset-required XID that leaves a GPU Unhealthy.
func runMonitoringScenario(t *testing.T, n *realNode, prom *framework.Prometheus) {
	ctx := framework.Context(t, 5*time.Minute)
	// Registered first, so run last of the scenario's cleanups: the
	// namespaces (and their claims) go first, then the tenants and
	// profiles, while the controller still runs to release its finalizers.
	t.Cleanup(func() { deleteQuotaDemoObjects(t) })
	dir := filepath.Join(repoRoot, "demo", "specs", "quota")
	for _, f := range []string{"00-profiles.yaml", "10-tenants.yaml", "20-claims.yaml"} {
		file := filepath.Join(dir, f)
		for _, o := range applySpec(t, t, file, readWorkloadSpec(t, file), "prom-quota") {
			if o.GetKind() == "Pod" {
				runningPod(t, ctx, o.GetNamespace(), o.GetName())
			}
		}
	}
	waitForSeries(t, ctx, prom, `gpuaas_claim_denials_total{tenant="team-a"}`)
	spendBudgetInSeconds(t, ctx, prom)
	createMonitoredShape(t, ctx)
	waitForSeries(t, ctx, prom, `gpuaas_shape_placeable{shape="prom-slot"}`)
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "too-big-again", Namespace: "team-a"},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "mig-1g"}}}}},
	}
	_, err := cp.Client.ResourceV1().ResourceClaims("team-a").Create(ctx, claim, metav1.CreateOptions{})
	if err == nil || !strings.Contains(err.Error(), "exceeded") {
		recapFatalf(t, "team-a's second claim over its limit: got %v, want a quota denial", err)
	}
	t.Logf("team-a at its limit, denied again: %v", err)
	lenderReclaims(t, ctx, prom)

	ns := cp.CreateNamespace(t, "prom-whole")
	createOneGPUTemplate(t, ctx, ns)
	pod := createAndRun(t, ctx, templateWorkloadPod(ns, "prepared-then-unprepared", "one-gpu"))
	deletePodAndWait(t, ctx, pod)
	waitForSeries(t, ctx, prom, `gpuaas_dra_plugin_claim_operations_total{operation=~"(?i)unprepare.*"}`)

	uuid := ""
	for _, d := range publishedDevicesOf(t, ctx) {
		if i, ok := intAttr(d, "index"); ok && i == xidGPU && stringAttr(d, "type") == "gpu" {
			uuid = stringAttr(d, "uuid")
		}
	}
	if uuid == "" {
		recapFatalf(t, "no whole GPU %d published", xidGPU)
	}
	stateDir := filepath.Join(n.KubeletDir, "plugins", framework.DriverName, "mock-nvml")
	// XID 48 (double-bit ECC) needs a reset: unlike XID 62 its taint does
	// not clear after the quiet period, so the GPU stays Unhealthy.
	if err := nvmock.InjectEvent(stateDir, uuid, nvml.EventTypeXidCriticalError, 48, nvmock.WholeGPU, nvmock.WholeGPU); err != nil {
		recapFatalf(t, "%v", err)
	}
	waitForSeries(t, ctx, prom, fmt.Sprintf(`gpuaas_gpu_posture{posture="Unhealthy", gpu="%d"}`, xidGPU))
	t.Logf("XID 48 on GPU %d (%s): Prometheus sees it Unhealthy", xidGPU, uuid)
}

// lenderReclaims: team-b, within its own limit, asks for a slice of the
// quota team-a borrows with claims no pod uses (queued, burst, made in that
// order): refused at first, then the controller deletes what it needs of
// them, newest first among those past the grace, through the chart's RBAC,
// and team-b's claim is admitted on a retry (issue 26 item 6; the chart
// here reclaims after reclaimAfterForTest).
func lenderReclaims(t *testing.T, ctx context.Context, prom *framework.Prometheus) {
	t.Helper()
	var borrowed []*resourceapi.ResourceClaim
	for _, name := range []string{"queued", "burst"} {
		c, err := cp.Client.ResourceV1().ResourceClaims("team-a").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			recapFatalf(t, "team-a's unallocated claim %s: %v", name, err)
		}
		borrowed = append(borrowed, c)
	}
	var last error
	err := wait.PollUntilContextTimeout(ctx, time.Second, time.Minute, true, func(ctx context.Context) (bool, error) {
		c := &resourceapi.ResourceClaim{
			ObjectMeta: metav1.ObjectMeta{Name: "needs-its-own", Namespace: "team-b"},
			Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
				Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "mig-1g"}}}}},
		}
		_, last = cp.Client.ResourceV1().ResourceClaims("team-b").Create(ctx, c, metav1.CreateOptions{})
		if last != nil && !strings.Contains(last.Error(), "has lent it out") {
			return false, last
		}
		return last == nil, nil
	})
	if err != nil {
		recapFatalf(t, "team-b's claim within its own limit: %v (last: %v)", err, last)
	}
	taken, kept := reclaimedNewestFirst(t, ctx, borrowed)
	if len(taken) == 0 {
		recapFatalf(t, "team-b was admitted, but none of team-a's unallocated claims was reclaimed (kept %v)", kept)
	}
	waitForSeries(t, ctx, prom, `gpuaas_quota_reclaimed_claims_total{tenant="team-a"}`)
	t.Logf("team-b took its own quota back from team-a's unallocated claims %v (kept %v)", taken, kept)
}

// publishedDevicesOf lists the real node's published devices.
func publishedDevicesOf(t *testing.T, ctx context.Context) []resourceapi.Device {
	t.Helper()
	devices, err := cp.PoolDevices(ctx, realNodeName)
	if err != nil || devices == nil {
		recapFatalf(t, "reading the node's devices: %v", err)
	}
	return devices
}

// deleteQuotaDemoObjects deletes the demo's TenantQuotas and GpuProfiles
// (cluster-scoped, so no namespace cleanup takes them) and waits until the
// controller let them go.
func deleteQuotaDemoObjects(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	objs := map[schema.GroupVersionResource][]string{
		tenantQuotaGVR: {"team-a", "team-b"},
		gpuProfileGVR:  {"h100", "mig-1g", "mig-3g", "shared-4way"},
	}
	for gvr, names := range objs {
		for _, name := range names {
			if err := cp.Dynamic.Resource(gvr).Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				recapErrorf(t, "cleanup: deleting %s %s: %v", gvr.Resource, name, err)
			}
		}
	}
	for gvr, names := range objs {
		for _, name := range names {
			err := wait.PollUntilContextCancel(ctx, 500*time.Millisecond, true, func(ctx context.Context) (bool, error) {
				_, err := cp.Dynamic.Resource(gvr).Get(ctx, name, metav1.GetOptions{})
				return apierrors.IsNotFound(err), nil
			})
			if err != nil {
				recapErrorf(t, "cleanup: %s %s not gone: %v", gvr.Resource, name, err)
			}
		}
	}
}

// waitForSeries waits until Prometheus has a series for expr.
func waitForSeries(t *testing.T, ctx context.Context, prom *framework.Prometheus, expr string) {
	t.Helper()
	var lastErr error
	err := wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		s, err := prom.Query(ctx, expr)
		lastErr = err
		return err == nil && len(s) > 0, nil
	})
	if err != nil {
		recapFatalf(t, "Prometheus never had %s: %v (last error %v)", expr, err, lastErr)
	}
}

// mixinQuery is one PromQL expression of the mixin.
type mixinQuery struct {
	kind   string // panel, variable, record, alert
	where  string // dashboard and panel title, or the rule's name
	expr   string // as Prometheus evaluates it (Grafana's variables replaced)
	alert  string
	record string
}

// quietAlert reports an alert the scenario must not set off: its
// expression must be empty (and its selectors still select series).
func (q mixinQuery) quietAlert() bool {
	_, fires := firingInScenario[q.alert]
	return q.kind == "alert" && !fires
}

// spendBudgetInSeconds cuts team-a's monthly budget (demo/specs/quota:
// 1.00, Notify, thresholds as defaulted) to 0.001, which the GPUs it holds
// at the profiles' prices spend in seconds, and waits until the leader's
// budget series say it is spent: the budget alerts then fire from the
// TenantUsage records through the chart's own rules (issue 58, Must show 2).
func spendBudgetInSeconds(t *testing.T, ctx context.Context, prom *framework.Prometheus) {
	t.Helper()
	q := &gpuaas.TenantQuota{ObjectMeta: metav1.ObjectMeta{Name: "team-a"}}
	updateObject(t, ctx, q, func(q *gpuaas.TenantQuota) {
		if q.Spec.Budget == nil {
			recapFatalf(t, "team-a has no budget in demo/specs/quota: the budget alerts have nothing to fire on")
		}
		q.Spec.Budget.Amount = resource.MustParse("0.001")
	})
	waitForSeries(t, ctx, prom, `gpuaas_tenant_budget_spent_ratio{tenant="team-a"} >= 1`)
}

func loadMixinRules(t *testing.T, path string) mixin.Rules {
	t.Helper()
	r, err := mixin.LoadRules(path)
	if err != nil {
		recapFatalf(t, "%v", err)
	}
	return r
}

func ruleQueries(r mixin.Rules) []mixinQuery {
	var out []mixinQuery
	for _, rule := range r.All() {
		if rule.Record != "" {
			out = append(out, mixinQuery{kind: "record", where: "record " + rule.Record, expr: rule.Expr, record: rule.Record})
		} else {
			out = append(out, mixinQuery{kind: "alert", where: "alert " + rule.Alert, expr: rule.Expr, alert: rule.Alert})
		}
	}
	return out
}

// grafanaVar is a Grafana variable reference: $name or ${name}.
var grafanaVar = regexp.MustCompile(`\$\{?(\w+)\}?`)

// grafanaToPromQL replaces Grafana's variables with what Prometheus can
// evaluate: the interval variables with fixed durations, every template
// variable with ".*" (the dashboards' "All").
func grafanaToPromQL(expr string) string {
	return grafanaVar.ReplaceAllStringFunc(expr, func(v string) string {
		switch strings.Trim(v, "${}") {
		case "__rate_interval", "__interval":
			return rateInterval
		case "__range":
			return rangeWindow
		}
		return ".*"
	})
}

// labelValues is Grafana's variable query label_values(<selector>, <label>).
var labelValues = regexp.MustCompile(`^\s*label_values\((.*),\s*(\w+)\s*\)\s*$`)

// loadDashboardQueries reads every query of every dashboard: each panel
// target's, rows' nested panels included, and each query variable's (a
// dropdown with no values is a dashboard with no data too).
func loadDashboardQueries(t *testing.T) []mixinQuery {
	t.Helper()
	dashboards, err := mixin.LoadDashboards(filepath.Join(repoRoot, mixin.Dir, "dashboards"))
	if err != nil {
		recapFatalf(t, "%v", err)
	}
	var out []mixinQuery
	for _, d := range dashboards {
		vars, err := d.VariableQueries()
		if err != nil {
			recapFatalf(t, "%s: %v", d.File, err)
		}
		for _, v := range vars {
			m := labelValues.FindStringSubmatch(v.Expr)
			if m == nil {
				recapFatalf(t, "%s: variable %s: query %q is not label_values(<selector>, <label>)", d.File, v.Name, v.Expr)
			}
			// The values Grafana offers are those of the label on the
			// selector's series.
			out = append(out, mixinQuery{kind: "variable", where: d.Title + " / $" + v.Name,
				expr: fmt.Sprintf("count by (%s) (%s)", m[2], grafanaToPromQL(m[1]))})
		}
		for _, p := range d.AllPanels() {
			for i, tg := range p.Targets {
				if tg.Expr == "" {
					continue
				}
				out = append(out, mixinQuery{kind: "panel", where: fmt.Sprintf("%s / %s #%d", d.Title, p.Title, i+1), expr: grafanaToPromQL(tg.Expr)})
			}
		}
	}
	return out
}

// queryResult is what evaluating one query found.
type queryResult struct {
	kind, where string
	size        int
	// witnesses are the result sizes of the query's selectors.
	witnesses []int
	problem   string
}

// evaluateAll evaluates every query, again every few seconds for those
// not right yet, up to queryPatience: rates need two samples, and
// recording rules feed alerts and panels an evaluation round later.
func evaluateAll(t *testing.T, ctx context.Context, prom *framework.Prometheus, queries []mixinQuery) []queryResult {
	t.Helper()
	results := make([]queryResult, len(queries))
	done := make([]bool, len(queries))
	deadline := time.Now().Add(queryPatience)
	for {
		left := 0
		for i, q := range queries {
			if done[i] {
				continue
			}
			results[i] = evaluateQuick(ctx, prom, q, !q.quietAlert())
			done[i] = results[i].problem == ""
			if !done[i] {
				left++
			}
		}
		if left == 0 || time.Now().After(deadline) || ctx.Err() != nil {
			return results
		}
		time.Sleep(3 * time.Second)
	}
}

// evaluateQuick evaluates a query once: it must return data (wantData) or
// be empty (an alert that must not fire), and each of its selectors, state
// matchers dropped, must select series: an expression may be empty because
// nothing is wrong, never because it reads a metric nobody exports.
func evaluateQuick(ctx context.Context, prom *framework.Prometheus, q mixinQuery, wantData bool) queryResult {
	r := queryResult{kind: q.kind, where: q.where}
	samples, err := prom.Query(ctx, q.expr)
	if err != nil {
		r.problem = err.Error()
		return r
	}
	r.size = len(samples)
	var problems []string
	switch {
	case wantData && r.size == 0:
		problems = append(problems, fmt.Sprintf("no data: %s", q.expr))
	case !wantData && r.size > 0:
		problems = append(problems, fmt.Sprintf("set off where nothing is wrong: %v", samples))
	}
	if q.kind == "record" {
		// What the rule manager stored under the rule's name, which
		// panels and alerts read.
		if got, err := prom.Query(ctx, q.record); err != nil || len(got) == 0 {
			problems = append(problems, fmt.Sprintf("no recorded series %s (%v)", q.record, err))
		}
	}
	sels, err := promSelectors(q.expr)
	if err != nil {
		problems = append(problems, err.Error())
	}
	for _, s := range sels {
		w := s.witness()
		got, err := prom.Query(ctx, w)
		if err != nil {
			problems = append(problems, err.Error())
			continue
		}
		r.witnesses = append(r.witnesses, len(got))
		if _, exempt := witnessExemptions[w]; len(got) == 0 && !exempt {
			problems = append(problems, fmt.Sprintf("selector %s selects no series", w))
		}
	}
	r.problem = strings.Join(problems, "; ")
	return r
}

// checkRuleHealth: Prometheus evaluates every rule without error.
func checkRuleHealth(t *testing.T, ctx context.Context, prom *framework.Prometheus) {
	t.Helper()
	rules, err := prom.Rules(ctx)
	if err != nil {
		recapFatalf(t, "%v", err)
	}
	for _, r := range rules {
		if r.Health != "ok" {
			recapErrorf(t, "rule %s (%s): health %q, last error %q", r.Name, r.Type, r.Health, r.LastError)
		}
	}
	t.Logf("Prometheus evaluates %d rules (%s and its alerts without for), all healthy", len(rules), mixin.RuleFile)
}

// checkAlerts: the alerts the scenario sets off are pending as the chart
// ships them and firing in the copy without `for`, with the expected
// labels; no other alert is active in either.
func checkAlerts(t *testing.T, ctx context.Context, prom *framework.Prometheus, rules mixin.Rules) {
	t.Helper()
	known := map[string]bool{}
	for _, q := range ruleQueries(rules) {
		if q.kind == "alert" {
			known[q.alert] = true
		}
	}
	for name := range firingInScenario {
		if !known[name] {
			recapErrorf(t, "alert %s, meant to fire in the scenario, is not in the rule file", name)
		}
	}
	// active reports whether an alert of that name and labels is in state,
	// in the copy (immediate) or the original.
	active := func(alerts []framework.Alert, name string, want map[string]string, immediate bool, states ...string) bool {
		for _, a := range alerts {
			_, copied := a.Labels[immediateLabel]
			if a.Labels["alertname"] == name && copied == immediate && labelsInclude(a.Labels, want) && slices.Contains(states, a.State) {
				return true
			}
		}
		return false
	}
	var alerts []framework.Alert
	err := wait.PollUntilContextTimeout(ctx, 2*time.Second, queryPatience, true, func(ctx context.Context) (bool, error) {
		var err error
		if alerts, err = prom.Alerts(ctx); err != nil {
			return false, err
		}
		for name, want := range firingInScenario {
			if !active(alerts, name, want, false, "pending", "firing") || !active(alerts, name, want, true, "firing") {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		recapErrorf(t, "alerts %v not pending (as shipped) and firing (without for): %v; active: %+v", firingInScenario, err, alerts)
	}
	for _, a := range alerts {
		name := a.Labels["alertname"]
		if _, ok := firingInScenario[name]; !ok {
			recapErrorf(t, "alert %s is %s, but nothing it watches went wrong: %v", name, a.State, a.Labels)
			continue
		}
		t.Logf("alert %s %s: %v = %s", name, a.State, a.Labels, a.Value)
	}
}

func labelsInclude(labels, want map[string]string) bool {
	for k, v := range want {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// promSelector is one vector selector of a PromQL expression: the metric
// name and its label matchers, each as written (`node=~".*"`).
type promSelector struct {
	metric   string
	matchers [][2]string // label, the rest (operator and quoted value)
}

// witness is the selector without its state matchers.
func (s promSelector) witness() string {
	var kept []string
	for _, m := range s.matchers {
		if !stateLabels[m[0]] {
			kept = append(kept, m[0]+m[1])
		}
	}
	if len(kept) == 0 {
		return s.metric
	}
	return s.metric + "{" + strings.Join(kept, ", ") + "}"
}

// promKeywords are PromQL words that are not metric names where they
// stand without a parenthesis after them: aggregations with a `by` clause
// between, binary operators and modifiers.
var promKeywords = map[string]bool{
	"sum": true, "min": true, "max": true, "avg": true, "group": true, "stddev": true, "stdvar": true,
	"count": true, "count_values": true, "bottomk": true, "topk": true, "quantile": true,
	"and": true, "or": true, "unless": true, "bool": true, "offset": true,
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
	"inf": true, "nan": true,
}

// promSelectors finds the vector selectors of a PromQL expression. It is a
// scanner, not a parser (Prometheus's parser is a module this repository
// does not take on): identifiers followed by "(" are functions, label
// lists after by/on/... are skipped, strings, ranges and numbers too.
func promSelectors(expr string) ([]promSelector, error) {
	var out []promSelector
	isIdentStart := func(c byte) bool { return c == '_' || c == ':' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }
	isIdent := func(c byte) bool { return isIdentStart(c) || c >= '0' && c <= '9' }
	skipSpace := func(i int) int {
		for i < len(expr) && (expr[i] == ' ' || expr[i] == '\t' || expr[i] == '\n') {
			i++
		}
		return i
	}
	// skipString returns the index after the string starting at i.
	skipString := func(i int) (int, error) {
		q := expr[i]
		for j := i + 1; j < len(expr); j++ {
			if expr[j] == '\\' && q != '`' {
				j++
				continue
			}
			if expr[j] == q {
				return j + 1, nil
			}
		}
		return 0, fmt.Errorf("unterminated string in %q", expr)
	}
	for i := 0; i < len(expr); {
		c := expr[i]
		switch {
		case c == '"' || c == '\'' || c == '`':
			j, err := skipString(i)
			if err != nil {
				return nil, err
			}
			i = j
		case c == '[':
			j := strings.IndexByte(expr[i:], ']')
			if j < 0 {
				return nil, fmt.Errorf("unterminated range in %q", expr)
			}
			i += j + 1
		case c >= '0' && c <= '9' || c == '.':
			for i < len(expr) && (isIdent(expr[i]) || expr[i] == '.') {
				i++
			}
		case c == '{':
			return nil, fmt.Errorf("selector without a metric name in %q", expr)
		case isIdentStart(c):
			j := i
			for j < len(expr) && isIdent(expr[j]) {
				j++
			}
			word := expr[i:j]
			k := skipSpace(j)
			switch {
			case word == "by" || word == "without" || word == "on" || word == "ignoring" || word == "group_left" || word == "group_right":
				if k < len(expr) && expr[k] == '(' {
					end := strings.IndexByte(expr[k:], ')')
					if end < 0 {
						return nil, fmt.Errorf("unterminated label list in %q", expr)
					}
					k += end + 1
				}
				i = k
			case promKeywords[word] || k < len(expr) && expr[k] == '(':
				i = j
			default:
				s := promSelector{metric: word}
				i = j
				if k < len(expr) && expr[k] == '{' {
					end, matchers, err := scanMatchers(expr, k, skipString)
					if err != nil {
						return nil, err
					}
					s.matchers, i = matchers, end
				}
				out = append(out, s)
			}
		default:
			i++
		}
	}
	return out, nil
}

// scanMatchers reads the label matchers of a selector from the "{" at i
// and returns the index after its "}".
func scanMatchers(expr string, i int, skipString func(int) (int, error)) (int, [][2]string, error) {
	var out [][2]string
	body := ""
	j := i + 1
	for ; j < len(expr) && expr[j] != '}'; j++ {
		if expr[j] == '"' || expr[j] == '\'' || expr[j] == '`' {
			end, err := skipString(j)
			if err != nil {
				return 0, nil, err
			}
			j = end - 1
		}
	}
	if j >= len(expr) {
		return 0, nil, fmt.Errorf("unterminated selector in %q", expr)
	}
	body = expr[i+1 : j]
	for _, m := range splitMatchers(body) {
		m = strings.TrimSpace(m)
		if m == "" {
			continue
		}
		k := strings.IndexAny(m, "=!")
		if k <= 0 {
			return 0, nil, fmt.Errorf("matcher %q in %q", m, expr)
		}
		out = append(out, [2]string{strings.TrimSpace(m[:k]), m[k:]})
	}
	return j + 1, out, nil
}

// splitMatchers splits a selector's body at the commas outside strings.
func splitMatchers(body string) []string {
	var out []string
	start, quote := 0, byte(0)
	for i := 0; i < len(body); i++ {
		c := body[i]
		switch {
		case quote != 0 && c == '\\':
			i++
		case quote != 0 && c == quote:
			quote = 0
		case quote == 0 && (c == '"' || c == '\'' || c == '`'):
			quote = c
		case quote == 0 && c == ',':
			out = append(out, body[start:i])
			start = i + 1
		}
	}
	return append(out, body[start:])
}
