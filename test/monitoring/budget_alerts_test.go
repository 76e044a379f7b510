package monitoring

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/yaml"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller/billing"
	"github.com/gpuaas/gpu-dra-driver/pkg/quota"
)

// oneGPU charges every device of a claim in ns-a as a whole H100 of
// team-a.
type oneGPU struct{}

func (oneGPU) Holdings(_ context.Context, claim *resourceapi.ResourceClaim) (string, []quota.Held, error) {
	var out []quota.Held
	for _, res := range claim.Status.Allocation.Devices.Results {
		out = append(out, quota.Held{Request: res.Request, Class: "h100",
			Device: quota.DeviceID{Driver: res.Driver, Pool: res.Pool, Device: res.Device}, Model: "NVIDIA H100 80GB HBM3",
			Charge: quota.Charge{Units: quota.WholeUnits(1), Memory: 80 << 30}})
	}
	return "team-a", out, nil
}

// TestBudgetAlertsFromTheRecorder: the billing recorder itself (its
// records, its TenantQuota status and its metrics, scraped every minute)
// bills a whole H100 at 3.60 an hour against team-a's budget of 10 for
// three hours; Prometheus's rule engine (promtool test rules) evaluates the
// chart's alert rules on what was scraped: the 50% threshold fires 5
// minutes after minute 84, 80% after minute 134, the whole budget after
// minute 167, as the quota's conditions say.
func TestBudgetAlertsFromTheRecorder(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := gpuaas.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := resourceapi.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	start := time.Date(2026, 3, 10, 12, 0, 0, 0, time.UTC)
	claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns-a", Name: "train", UID: types.UID("uid-train")},
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
			Results: []resourceapi.DeviceRequestAllocationResult{{Request: "gpu", Driver: "gpu.gpuaas.io", Pool: "n1", Device: "gpu-0"}}}}}}
	profile := &gpuaas.GpuProfile{ObjectMeta: metav1.ObjectMeta{Name: "h100"},
		Spec: gpuaas.GpuProfileSpec{Price: &gpuaas.Price{PerGpuUnitHour: resource.MustParse("3.60")}}}
	tq := &gpuaas.TenantQuota{ObjectMeta: metav1.ObjectMeta{Name: "team-a"}, Spec: gpuaas.TenantQuotaSpec{Namespaces: []string{"ns-a"},
		Budget: &gpuaas.Budget{Amount: resource.MustParse("10")}}}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(claim, profile, tq).
		WithStatusSubresource(&gpuaas.TenantUsage{}, &gpuaas.TenantQuota{}, &resourceapi.ResourceClaim{}).Build()
	now := start
	r := &billing.Recorder{Client: c, Live: c, Meter: oneGPU{}, Currency: "EUR", Resync: 30 * time.Second, Now: func() time.Time { return now }}
	billing.RegisterMetrics(r)

	const minutes = 180
	series := map[string][]string{}
	exhaustedAt := -1
	for m := 0; m <= minutes; m++ {
		now = start.Add(time.Duration(m) * time.Minute)
		if _, err := r.Reconcile(t.Context(), reconcile.Request{}); err != nil {
			t.Fatalf("minute %d: %v", m, err)
		}
		var q gpuaas.TenantQuota
		if err := c.Get(t.Context(), client.ObjectKey{Name: "team-a"}, &q); err != nil {
			t.Fatal(err)
		}
		if exhaustedAt < 0 && meta.IsStatusConditionTrue(q.Status.Conditions, gpuaas.ConditionBudgetExhausted) {
			exhaustedAt = m
		}
		families, err := ctrlmetrics.Registry.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range families {
			if !strings.HasPrefix(f.GetName(), "gpuaas_tenant_budget_") {
				continue
			}
			for _, metric := range f.GetMetric() {
				labels := []string{`job="gpuaas-dra-controller"`, `instance="c1"`}
				for _, l := range metric.GetLabel() {
					labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
				}
				key := f.GetName() + "{" + strings.Join(labels, ",") + "}"
				for len(series[key]) < m {
					series[key] = append(series[key], "_")
				}
				series[key] = append(series[key], fmt.Sprintf("%g", metric.GetGauge().GetValue()))
			}
		}
	}
	if exhaustedAt != 167 {
		t.Fatalf("BudgetExhausted turned True at minute %d, want 167 (10.02 of 10)", exhaustedAt)
	}
	if len(series) < 5 { // amount, spent, ratio, 3 thresholds
		t.Fatalf("scraped series: %v", series)
	}

	_, rules := loadRules(t)
	annotations := func(alert string, labels map[string]string) map[string]string {
		for _, rule := range rules {
			if rule.Alert != alert {
				continue
			}
			out := map[string]string{}
			for k, v := range rule.Annotations {
				for l, lv := range labels {
					v = strings.ReplaceAll(v, "{{ $labels."+l+" }}", lv)
				}
				out[k] = v
			}
			return out
		}
		t.Fatalf("no alert %s in the rules", alert)
		return nil
	}
	expect := func(alert string, labels ...map[string]string) []map[string]any {
		out := []map[string]any{}
		for _, l := range labels {
			all := map[string]string{"tenant": "team-a"}
			for k, v := range l {
				all[k] = v
			}
			ann := annotations(alert, all)
			for _, rule := range rules {
				if rule.Alert == alert {
					all["severity"] = rule.Labels["severity"]
				}
			}
			out = append(out, map[string]any{"exp_labels": all, "exp_annotations": ann})
		}
		return out
	}
	threshold := func(p string) map[string]string { return map[string]string{"threshold": p} }
	type evalCase struct {
		EvalTime  string           `json:"eval_time"`
		Alertname string           `json:"alertname"`
		ExpAlerts []map[string]any `json:"exp_alerts"`
	}
	cases := []evalCase{
		{"88m", "GpuaasTenantBudgetThresholdReached", expect("GpuaasTenantBudgetThresholdReached")},
		{"90m", "GpuaasTenantBudgetThresholdReached", expect("GpuaasTenantBudgetThresholdReached", threshold("50"))},
		{"138m", "GpuaasTenantBudgetThresholdReached", expect("GpuaasTenantBudgetThresholdReached", threshold("50"))},
		{"140m", "GpuaasTenantBudgetThresholdReached", expect("GpuaasTenantBudgetThresholdReached", threshold("50"), threshold("80"))},
		{"171m", "GpuaasTenantBudgetExhausted", expect("GpuaasTenantBudgetExhausted")},
		{"173m", "GpuaasTenantBudgetExhausted", expect("GpuaasTenantBudgetExhausted", map[string]string{})},
		{"173m", "GpuaasTenantBudgetThresholdReached", expect("GpuaasTenantBudgetThresholdReached", threshold("50"), threshold("80"))},
	}
	keys := make([]string, 0, len(series))
	for k := range series {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var inputs []map[string]string
	for _, k := range keys {
		inputs = append(inputs, map[string]string{"series": k, "values": strings.Join(series[k], " ")})
	}
	file := map[string]any{
		"rule_files":          []string{mixinPath(t, "rules", "gpuaas-dra.rules.yaml")},
		"evaluation_interval": "1m",
		"tests":               []any{map[string]any{"interval": "1m", "input_series": inputs, "alert_rule_test": cases}},
	}
	data, err := yaml.Marshal(file)
	t.Logf("promtool test file: %d series, %d evaluations", len(inputs), len(cases))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "budget.test.yaml")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	// Without promtool, what the recorder did is checked, its alerts not.
	promtool := tool(t, "promtool", "hack/build-prometheus.sh (make prometheus)")
	out, err := run(t, repoRoot(t), promtool, "test", "rules", path)
	if err != nil {
		t.Fatalf("promtool test rules on the recorder's metrics: %v\n%s\n%s", err, out, data)
	}
	t.Logf("promtool: %s", strings.TrimSpace(out))
}
