package monitoring

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"text/template"

	autoscalingv2 "k8s.io/api/autoscaling/v2"
	"sigs.k8s.io/yaml"
)

// autoscalingSection is the heading of docs/monitoring.md whose examples
// TestAutoscalingQueries runs.
const autoscalingSection = "## Autoscaling on use"

// useMetric is the plugin's metric the examples scale on.
const useMetric = "gpuaas_claim_gpu_utilization_per_unit"

// adapterValues is the part of prometheus-adapter's values the example
// sets: its custom rules.
type adapterValues struct {
	Rules struct {
		Custom []adapterRule `json:"custom"`
	} `json:"rules"`
}

type adapterRule struct {
	SeriesQuery string `json:"seriesQuery"`
	Resources   struct {
		Overrides map[string]struct {
			Resource string `json:"resource"`
		} `json:"overrides"`
	} `json:"resources"`
	Name struct {
		Matches string `json:"matches"`
		As      string `json:"as"`
	} `json:"name"`
	MetricsQuery string `json:"metricsQuery"`
}

// kedaSpec is the part of a KEDA ScaledObject's spec the example sets.
type kedaSpec struct {
	Triggers []struct {
		Type       string            `json:"type"`
		MetricType string            `json:"metricType"`
		Metadata   map[string]string `json:"metadata"`
	} `json:"triggers"`
}

// sectionYAMLBlocks returns the ```yaml blocks under a level-2 heading of a
// Markdown file, up to the next level-2 heading.
func sectionYAMLBlocks(t *testing.T, path, heading string) []string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var blocks []string
	in, found := false, false
	var cur *strings.Builder
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case cur != nil && strings.HasPrefix(line, "```"):
			blocks = append(blocks, cur.String())
			cur = nil
		case cur != nil:
			cur.WriteString(line + "\n")
		case strings.HasPrefix(line, "## "):
			in = line == heading
			found = found || in
		case in && strings.HasPrefix(line, "```yaml"):
			cur = &strings.Builder{}
		}
	}
	if !found {
		t.Fatalf("%s has no section %q", path, heading)
	}
	return blocks
}

// autoscalingExamples are the section's prometheus-adapter rule, HPA and
// KEDA spec, told apart by what they hold.
func autoscalingExamples(t *testing.T) (adapterRule, autoscalingv2.HorizontalPodAutoscaler, kedaSpec) {
	t.Helper()
	var rules []adapterRule
	var hpas []autoscalingv2.HorizontalPodAutoscaler
	var kedas []kedaSpec
	for _, b := range sectionYAMLBlocks(t, filepath.Join(repoRoot(t), "docs", "monitoring.md"), autoscalingSection) {
		var probe map[string]any
		if err := yaml.Unmarshal([]byte(b), &probe); err != nil {
			t.Fatalf("a block of %q is not YAML: %v\n%s", autoscalingSection, err, b)
		}
		var err error
		switch {
		case probe["kind"] == "HorizontalPodAutoscaler":
			var hpa autoscalingv2.HorizontalPodAutoscaler
			err = yaml.UnmarshalStrict([]byte(b), &hpa)
			hpas = append(hpas, hpa)
		case probe["rules"] != nil:
			var v adapterValues
			err = yaml.Unmarshal([]byte(b), &v)
			rules = append(rules, v.Rules.Custom...)
		case probe["triggers"] != nil:
			var k kedaSpec
			err = yaml.Unmarshal([]byte(b), &k)
			kedas = append(kedas, k)
		default:
			t.Fatalf("a block of %q is none of the adapter's values, an HPA, a ScaledObject's spec:\n%s", autoscalingSection, b)
		}
		if err != nil {
			t.Fatalf("%v\n%s", err, b)
		}
	}
	if len(rules) != 1 || len(hpas) != 1 || len(kedas) != 1 || len(kedas[0].Triggers) != 1 {
		t.Fatalf("want one adapter rule, one HPA and one ScaledObject with one trigger in %q; got %d, %d, %d", autoscalingSection, len(rules), len(hpas), len(kedas))
	}
	return rules[0], hpas[0], kedas[0]
}

// renderAdapterQuery renders a metricsQuery as prometheus-adapter does for
// the pods of one namespace: a Go template with << >> delimiters, the
// series' name, the matchers of the resources asked for, and the label
// grouped by.
func renderAdapterQuery(t *testing.T, rule adapterRule, namespace string, pods []string) string {
	t.Helper()
	tmpl, err := template.New("metricsQuery").Delims("<<", ">>").Parse(rule.MetricsQuery)
	if err != nil {
		t.Fatalf("metricsQuery %q: %v", rule.MetricsQuery, err)
	}
	var out strings.Builder
	err = tmpl.Execute(&out, struct {
		Series, LabelMatchers, GroupBy string
		GroupBySlice                   []string
	}{
		Series:        useMetric,
		LabelMatchers: fmt.Sprintf(`namespace=%q,pod=~%q`, namespace, strings.Join(pods, "|")),
		GroupBy:       "pod",
		GroupBySlice:  []string{"pod"},
	})
	if err != nil {
		t.Fatalf("metricsQuery %q: %v", rule.MetricsQuery, err)
	}
	return out.String()
}

// useSeries are the plugin's series the queries run on: two pods of the
// Deployment (one with a GPU at 90%, one with two at 40% and 60%), another
// pod of the namespace, a claim of several pods (pod ""), and a pod of the
// same name in another namespace.
var useSeries = []struct {
	namespace, pod, claim, device string
	value                         int
}{
	{"inference", "llm-server-7d9f-a", "a-gpu", "gpu-0", 90},
	{"inference", "llm-server-7d9f-b", "b-gpu-0", "gpu-1", 40},
	{"inference", "llm-server-7d9f-b", "b-gpu-1", "gpu-2", 60},
	{"inference", "notebook-0", "nb", "gpu-3-ts-0", 5},
	{"inference", "", "spanning", "gpu-4", 100},
	{"research", "llm-server-7d9f-a", "x", "gpu-5", 10},
}

// promExprTest is one expression and the samples promtool must find.
type promExprTest struct {
	Expr       string      `json:"expr"`
	EvalTime   string      `json:"eval_time"`
	ExpSamples []expSample `json:"exp_samples"`
}

type expSample struct {
	Labels string  `json:"labels"`
	Value  float64 `json:"value"`
}

// TestAutoscalingQueries: the queries of docs/monitoring.md's "Autoscaling
// on use" run in Prometheus's engine (promtool test rules) on the plugin's
// series and give what the page says: the adapter's metricsQuery, rendered
// as the adapter renders it for the Deployment's two pods, each pod's
// average over its devices; its seriesQuery every pod of a claim but not a
// claim of several pods; KEDA's query the average of the pods' averages.
// The HPA names the adapter's metric, the adapter maps labels the metric
// has, and every query names the plugin's real metric and labels.
func TestAutoscalingQueries(t *testing.T) {
	rule, hpa, keda := autoscalingExamples(t)
	inv := fullInventory(t)
	m := inv[useMetric]
	if m == nil {
		t.Fatalf("%s is not registered by the plugin", useMetric)
	}
	for label, r := range rule.Resources.Overrides {
		if !m.labels[label] {
			t.Errorf("the adapter maps label %s (to %s), which %s does not have", label, r.Resource, useMetric)
		}
	}
	if rule.Resources.Overrides["namespace"].Resource != "namespace" || rule.Resources.Overrides["pod"].Resource != "pod" {
		t.Errorf("the adapter rule must map namespace and pod to their resources: %v", rule.Resources.Overrides)
	}
	if ok, err := regexp.MatchString(rule.Name.Matches, useMetric); err != nil || !ok {
		t.Errorf("the adapter rule's name.matches %q does not match %s (%v)", rule.Name.Matches, useMetric, err)
	}
	metrics := hpa.Spec.Metrics
	if len(metrics) != 1 || metrics[0].Type != autoscalingv2.PodsMetricSourceType || metrics[0].Pods == nil {
		t.Fatalf("the HPA must have one Pods metric: %+v", metrics)
	}
	if got := metrics[0].Pods.Metric.Name; got != rule.Name.As {
		t.Errorf("the HPA scales on %q, the adapter serves %q", got, rule.Name.As)
	}
	if tg := metrics[0].Pods.Target; tg.Type != autoscalingv2.AverageValueMetricType || tg.AverageValue == nil || tg.AverageValue.IsZero() {
		t.Errorf("the HPA's target must be a non-zero AverageValue: %+v", tg)
	}
	trigger := keda.Triggers[0]
	if trigger.Type != "prometheus" || trigger.Metadata["query"] == "" || trigger.Metadata["serverAddress"] == "" {
		t.Errorf("the ScaledObject's trigger must be prometheus with a serverAddress and a query: %+v", trigger)
	}
	if _, err := strconv.ParseFloat(trigger.Metadata["threshold"], 64); err != nil {
		t.Errorf("the ScaledObject's threshold %q is not a number: %v", trigger.Metadata["threshold"], err)
	}

	adapterQuery := renderAdapterQuery(t, rule, "inference", []string{"llm-server-7d9f-a", "llm-server-7d9f-b"})
	tests := []promExprTest{
		{Expr: adapterQuery, EvalTime: "5m", ExpSamples: []expSample{
			{Labels: `{pod="llm-server-7d9f-a"}`, Value: 90},
			{Labels: `{pod="llm-server-7d9f-b"}`, Value: 50},
		}},
		{Expr: "count by (namespace, pod) (" + rule.SeriesQuery + ")", EvalTime: "5m", ExpSamples: []expSample{
			{Labels: `{namespace="inference", pod="llm-server-7d9f-a"}`, Value: 1},
			{Labels: `{namespace="inference", pod="llm-server-7d9f-b"}`, Value: 2},
			{Labels: `{namespace="inference", pod="notebook-0"}`, Value: 1},
			{Labels: `{namespace="research", pod="llm-server-7d9f-a"}`, Value: 1},
		}},
		{Expr: trigger.Metadata["query"], EvalTime: "5m", ExpSamples: []expSample{{Labels: `{}`, Value: 70}}},
	}
	var qs []query
	for i, tc := range tests {
		qs = append(qs, query{where: fmt.Sprintf("%s, query %d", autoscalingSection, i+1), expr: tc.Expr})
	}
	for _, p := range checkQueries(inv, nil, qs) {
		t.Error(p)
	}

	promtool := tool(t, "promtool", "hack/build-prometheus.sh (make prometheus)")
	var input []map[string]string
	for _, s := range useSeries {
		input = append(input, map[string]string{
			"series": fmt.Sprintf(`%s{job="gpuaas-dra-kubelet-plugin",instance="p1",node="n1",namespace=%q,pod=%q,claim=%q,device=%q,profile="h100"}`,
				useMetric, s.namespace, s.pod, s.claim, s.device),
			"values": fmt.Sprintf("%dx10", s.value),
		})
	}
	file := map[string]any{
		"rule_files":          []string{},
		"evaluation_interval": "1m",
		"tests": []any{map[string]any{
			"interval":         "1m",
			"input_series":     input,
			"promql_expr_test": tests,
		}},
	}
	data, err := yaml.Marshal(file)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "autoscaling.test.yaml")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := run(t, repoRoot(t), promtool, "test", "rules", path)
	if err != nil {
		t.Fatalf("promtool test rules on the queries of %q: %v\n%s\n%s", autoscalingSection, err, out, data)
	}
	for _, tc := range tests {
		t.Logf("%s: %v", tc.Expr, tc.ExpSamples)
	}
}
