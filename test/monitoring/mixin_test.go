package monitoring

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/test/monitoring/mixin"
)

// query is one PromQL expression of the mixin and where it is.
type query struct {
	where string
	expr  string
}

func mixinPath(t *testing.T, parts ...string) string {
	return filepath.Join(append([]string{repoRoot(t), mixin.Dir}, parts...)...)
}

// loadRules reads every rule file: each by its file name, and all their
// rules in file order.
func loadRules(t *testing.T) (map[string]mixin.Rules, []mixin.Rule) {
	t.Helper()
	paths, err := filepath.Glob(mixinPath(t, "rules", "*.yaml"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no rule files under %s (%v)", mixinPath(t, "rules"), err)
	}
	files := map[string]mixin.Rules{}
	var all []mixin.Rule
	for _, p := range paths {
		f, err := mixin.LoadRules(p)
		if err != nil {
			t.Fatal(err)
		}
		files[filepath.Base(p)] = f
		all = append(all, f.All()...)
	}
	return files, all
}

func loadDashboards(t *testing.T) []mixin.Dashboard {
	t.Helper()
	out, err := mixin.LoadDashboards(mixinPath(t, "dashboards"))
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// mixinQueries is every expression of the mixin: rules, dashboard panels
// and dashboard variables.
func mixinQueries(t *testing.T, rules []mixin.Rule, dashboards []mixin.Dashboard) []query {
	var qs []query
	for _, r := range rules {
		name := r.Record
		if r.Alert != "" {
			name = "alert " + r.Alert
		}
		qs = append(qs, query{where: "rule " + name, expr: r.Expr})
	}
	for _, d := range dashboards {
		for _, p := range d.AllPanels() {
			for _, tg := range p.Targets {
				qs = append(qs, query{where: fmt.Sprintf("%s panel %q (%s)", d.File, p.Title, tg.RefID), expr: tg.Expr})
			}
		}
		vars, err := d.VariableQueries()
		if err != nil {
			t.Fatalf("%s: %v", d.File, err)
		}
		for _, v := range vars {
			qs = append(qs, query{where: fmt.Sprintf("%s variable $%s", d.File, v.Name), expr: v.Expr})
		}
	}
	return qs
}

// postureValues are the values the posture label can have, from the API's
// constants, so a renamed posture fails here too.
func postureValues() map[string]bool {
	m := map[string]bool{string(gpuaas.PostureDegraded): true, string(gpuaas.PostureEmpty): true}
	for _, p := range gpuaas.GpuPostures {
		m[string(p)] = true
	}
	return m
}

// checkQueries returns one message per name an expression uses that no
// binary registers: metrics, matcher labels, grouping labels, posture
// values. records are the recording rules' names and their labels.
func checkQueries(inv inventory, rules []mixin.Rule, qs []query) []string {
	var problems []string
	// Recording rules' series: their labels are those their expression
	// can carry (a superset: the labels of what it selects, plus target
	// labels), resolved in file order as Prometheus evaluates them.
	records := map[string]map[string]bool{}
	for _, r := range rules {
		if r.Record == "" {
			continue
		}
		names, err := parseNames(r.Expr)
		if err != nil {
			continue // reported below
		}
		labels := map[string]bool{}
		for _, s := range names.selectors {
			if m, suffix := baseMetric(inv, s.metric); m != nil {
				for l := range m.labels {
					labels[l] = true
				}
				if suffix == "_bucket" {
					labels["le"] = true
				}
			}
			for l := range records[s.metric] {
				labels[l] = true
			}
		}
		records[r.Record] = labels
	}
	postures := postureValues()
	for _, q := range qs {
		names, err := parseNames(q.expr)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", q.where, err))
			continue
		}
		known := map[string]bool{"le": true, "quantile": true}
		for l := range targetLabels {
			known[l] = true
		}
		for _, s := range names.selectors {
			var labels map[string]bool
			switch m, suffix := baseMetric(inv, s.metric); {
			case m != nil:
				labels = m.labels
				if labels != nil {
					labels = copySet(labels)
					if suffix == "_bucket" {
						labels["le"] = true
					}
				}
			case records[s.metric] != nil:
				labels = records[s.metric]
			case promSynthetic[s.metric]:
				labels = map[string]bool{}
			default:
				problems = append(problems, fmt.Sprintf("%s: metric %s is not registered by the plugin or the controller: %s", q.where, s.metric, q.expr))
				continue
			}
			for l := range labels {
				known[l] = true
			}
			for l, v := range s.labels {
				if labels != nil && !labels[l] && !targetLabels[l] {
					problems = append(problems, fmt.Sprintf("%s: %s has no label %s", q.where, s.metric, l))
				}
				if l == "posture" {
					for _, alt := range strings.Split(v, "|") {
						if !postures[alt] {
							problems = append(problems, fmt.Sprintf("%s: %s: no posture %q", q.where, s.metric, alt))
						}
					}
				}
			}
		}
		for _, l := range append(names.grouping, names.labelValuesLabel) {
			if l != "" && !known[l] {
				problems = append(problems, fmt.Sprintf("%s: grouping label %s is not a label of anything the expression selects", q.where, l))
			}
		}
	}
	return problems
}

func copySet(m map[string]bool) map[string]bool {
	out := make(map[string]bool, len(m))
	for k := range m {
		out[k] = true
	}
	return out
}

// TestMixinUsesRegisteredMetrics: every dashboard panel, dashboard
// variable and rule names only metrics the binaries register (or recording
// rules of the mixin, or Prometheus's own up), with their real labels; and
// every metric of our own is shown or alerted on somewhere.
func TestMixinUsesRegisteredMetrics(t *testing.T) {
	inv := fullInventory(t)
	_, rules := loadRules(t)
	dashboards := loadDashboards(t)
	qs := mixinQueries(t, rules, dashboards)
	for _, p := range checkQueries(inv, rules, qs) {
		t.Error(p)
	}
	used := map[string]bool{}
	for _, q := range qs {
		names, _ := parseNames(q.expr)
		for _, s := range names.selectors {
			if m, _ := baseMetric(inv, s.metric); m != nil {
				used[m.name] = true
			}
		}
	}
	var unused []string
	for name := range inv {
		if strings.HasPrefix(name, "gpuaas_") && !used[name] {
			unused = append(unused, name)
		}
	}
	sort.Strings(unused)
	if len(unused) > 0 {
		t.Errorf("metrics of ours that no dashboard or rule uses: %s", strings.Join(unused, ", "))
	}
	sources := map[string]int{}
	for _, m := range inv {
		sources[m.from]++
	}
	t.Logf("checked %d expressions (%d rules, %d dashboards) against %d registered metrics: %v", len(qs), len(rules), len(dashboards), len(inv), sources)
}

// TestMixinCheckCatchesRenamedMetric: the check above fails on a rule
// whose metric was renamed (or whose label was), so a rename in the code
// without one in the mixin fails TestMixinUsesRegisteredMetrics.
func TestMixinCheckCatchesRenamedMetric(t *testing.T) {
	inv := fullInventory(t)
	_, rules := loadRules(t)
	for _, tc := range []struct{ from, to, want string }{
		{"gpuaas_gpu_posture{", "gpuaas_gpu_state{", "metric gpuaas_gpu_state is not registered"},
		{"gpuaas_claim_denials_total", "gpuaas_claim_rejections_total", "metric gpuaas_claim_rejections_total is not registered"},
		{`posture="Unhealthy"`, `posture="Broken"`, `no posture "Broken"`},
		{"by (tenant, resource)", "by (tenant, reason)", "grouping label reason"},
		{`{result="error"}`, `{outcome="error"}`, "has no label outcome"},
	} {
		var mutated []mixin.Rule
		hit := false
		for _, r := range rules {
			if strings.Contains(r.Expr, tc.from) {
				r.Expr = strings.Replace(r.Expr, tc.from, tc.to, 1)
				hit = true
			}
			mutated = append(mutated, r)
		}
		if !hit {
			t.Fatalf("no rule contains %q", tc.from)
		}
		problems := checkQueries(inv, mutated, mixinQueries(t, mutated, nil))
		caught := ""
		for _, p := range problems {
			if strings.Contains(p, tc.want) {
				caught = p
			}
		}
		if caught == "" {
			t.Errorf("renaming %s to %s: want a problem with %q, got %q", tc.from, tc.to, tc.want, problems)
		} else {
			t.Logf("renaming %s to %s is caught: %s", tc.from, tc.to, caught)
		}
	}
}

// TestDashboardsWellFormed: unique uids and panel ids, every panel queries
// something through the dashboard's datasource variable (so the
// dashboards work on any Grafana, whatever its Prometheus is called).
func TestDashboardsWellFormed(t *testing.T) {
	uids := map[string]string{}
	for _, d := range loadDashboards(t) {
		file := d.File
		if d.UID == "" || d.Title == "" {
			t.Errorf("%s: no uid or title", file)
		}
		if other, ok := uids[d.UID]; ok {
			t.Errorf("%s and %s share uid %s", file, other, d.UID)
		}
		uids[d.UID] = file
		ids := map[int]bool{}
		for _, p := range d.AllPanels() {
			if p.Type == "row" {
				continue
			}
			if ids[p.ID] {
				t.Errorf("%s: panel id %d repeated", file, p.ID)
			}
			ids[p.ID] = true
			if len(p.Targets) == 0 {
				t.Errorf("%s panel %q: no query", file, p.Title)
			}
			if p.Datasource["uid"] != "${datasource}" {
				t.Errorf("%s panel %q: datasource %v, want the ${datasource} variable", file, p.Title, p.Datasource)
			}
			for _, tg := range p.Targets {
				if strings.TrimSpace(tg.Expr) == "" || tg.RefID == "" {
					t.Errorf("%s panel %q: a target without expr or refId", file, p.Title)
				}
			}
		}
		t.Logf("%s (%s): %d panels", file, d.Title, len(ids))
	}
}

// promtoolTests is the promtool unit test files' alert tests.
type promtoolTests struct {
	RuleFiles []string `json:"rule_files"`
	Tests     []struct {
		AlertRuleTest []struct {
			Alertname string           `json:"alertname"`
			ExpAlerts []map[string]any `json:"exp_alerts"`
		} `json:"alert_rule_test"`
	} `json:"tests"`
}

// TestAlertsHaveTestsAndRunbooks: every alert has a promtool unit test in
// which it fires, a runbook_url, and that runbook's section in
// docs/monitoring.md.
func TestAlertsHaveTestsAndRunbooks(t *testing.T) {
	_, rules := loadRules(t)
	fires := map[string]bool{}
	paths, _ := filepath.Glob(mixinPath(t, "tests", "*.yaml"))
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		var f promtoolTests
		if err := yaml.Unmarshal(data, &f); err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		for _, tc := range f.Tests {
			for _, a := range tc.AlertRuleTest {
				if len(a.ExpAlerts) > 0 {
					fires[a.Alertname] = true
				}
			}
		}
	}
	doc, err := os.ReadFile(filepath.Join(repoRoot(t), "docs", "monitoring.md"))
	if err != nil {
		t.Fatal(err)
	}
	headings := map[string]bool{}
	for _, line := range strings.Split(string(doc), "\n") {
		if h, ok := strings.CutPrefix(line, "### "); ok {
			headings[strings.ToLower(strings.TrimSpace(h))] = true
		}
	}
	n := 0
	for _, r := range rules {
		if r.Alert == "" {
			continue
		}
		n++
		if !fires[r.Alert] {
			t.Errorf("alert %s: no promtool unit test under %s/tests makes it fire", r.Alert, mixin.Dir)
		}
		anchor := strings.ToLower(r.Alert)
		if want := "https://github.com/gpuaas/gpu-dra-driver/blob/main/docs/monitoring.md#" + anchor; r.Annotations["runbook_url"] != want {
			t.Errorf("alert %s: runbook_url %q, want %q", r.Alert, r.Annotations["runbook_url"], want)
		}
		if !headings[anchor] {
			t.Errorf("alert %s: docs/monitoring.md has no section \"### %s\"", r.Alert, r.Alert)
		}
		if r.Labels["severity"] == "" {
			t.Errorf("alert %s: no severity label", r.Alert)
		}
	}
	t.Logf("%d alerts, each with a firing unit test and a runbook", n)
}
