package main

import (
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
)

func TestStatementLines(t *testing.T) {
	start := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	usage := func(tenant, period string) gpuaas.TenantUsage {
		return gpuaas.TenantUsage{Spec: gpuaas.TenantUsageSpec{Tenant: tenant, Period: period, Start: metav1.NewTime(start), End: metav1.NewTime(start.AddDate(0, 1, 0))},
			Status: gpuaas.TenantUsageStatus{Currency: "USD", Totals: []gpuaas.UsageTotal{{Profile: "mig-1g", GpuModel: "NVIDIA H100 80GB HBM3",
				Price: resource.MustParse("4.20"), Records: 2, UnitSeconds: "3600/7"}}}}
	}
	quota := gpuaas.TenantQuota{ObjectMeta: metav1.ObjectMeta{Name: "team-a"}, Spec: gpuaas.TenantQuotaSpec{
		Budget: &gpuaas.Budget{Amount: resource.MustParse("1.00")}},
		Status: gpuaas.TenantQuotaStatus{Budget: &gpuaas.BudgetStatus{Period: "2026-12", Spent: "0.600000", Amount: resource.MustParse("1.00"),
			Currency: "USD", Percent: 60, ThresholdsCrossed: []int32{50}}}}
	lines := statementLines([]gpuaas.TenantUsage{usage("team-b", "2026-12"), usage("team-a", "2026-12"), usage("team-a", "2026-11")},
		[]gpuaas.TenantQuota{quota}, "2026-12")
	out := strings.Join(lines, "\n")
	t.Logf("\n%s", out)
	for _, want := range []string{"Statement of tenant team-a for 2026-12", "mig-1g", "0.600000 USD",
		"budget 1 USD (Notify): spent 0.600000, 60%, thresholds crossed [50]", "--csv: 1 rows of FOCUS 1.2 columns", "Statement of tenant team-b"} {
		if !strings.Contains(out, want) {
			t.Errorf("lacks %q", want)
		}
	}
	if strings.Index(out, "team-a") > strings.Index(out, "team-b") || strings.Count(out, "Statement of tenant") != 2 {
		t.Error("want team-a then team-b, this period only")
	}
	if got := statementLines(nil, nil, "2026-12"); len(got) != 1 || !strings.Contains(got[0], "no usage") {
		t.Errorf("no usage: %q", got)
	}
}
