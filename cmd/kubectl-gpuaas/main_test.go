package main

import (
	"bytes"
	"context"
	"encoding/csv"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/statement"
)

func tenantUsage(tenant, period string, unitSeconds string) *gpuaas.TenantUsage {
	start, _ := time.Parse("2006-01", period)
	return &gpuaas.TenantUsage{ObjectMeta: metav1.ObjectMeta{Name: tenant + "-" + period},
		Spec: gpuaas.TenantUsageSpec{Tenant: tenant, Period: period, Start: metav1.NewTime(start), End: metav1.NewTime(start.AddDate(0, 1, 0))},
		Status: gpuaas.TenantUsageStatus{Currency: "USD", Totals: []gpuaas.UsageTotal{{Profile: "whole", GpuModel: "NVIDIA H100 80GB HBM3",
			Node: "n1", Price: resource.MustParse("3.60"), Records: 1, UnitSeconds: unitSeconds}}}}
}

// TestStatementOfEveryTenant: without --tenant, the period's statements of
// every tenant (not another period's), as text and as CSV that reads back.
func TestStatementOfEveryTenant(t *testing.T) {
	s := runtime.NewScheme()
	if err := gpuaas.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientBuilder().WithScheme(s).WithObjects(tenantUsage("team-b", "2026-03", "7200"),
		tenantUsage("team-a", "2026-03", "3600"), tenantUsage("team-a", "2026-02", "99")).Build()
	ctx := context.Background()
	usages, err := statement.Read(ctx, c, "", "2026-03")
	if err != nil || len(usages) != 2 || usages[0].Spec.Tenant != "team-a" {
		t.Fatalf("read: %v, %d usages", err, len(usages))
	}
	var text bytes.Buffer
	if err := write(&text, usages, false); err != nil {
		t.Fatal(err)
	}
	if out := text.String(); !strings.Contains(out, "tenant team-a for 2026-03") || !strings.Contains(out, "tenant team-b") ||
		!strings.Contains(out, "3.600000 USD") || !strings.Contains(out, "7.200000 USD") {
		t.Errorf("text:\n%s", out)
	}
	var out bytes.Buffer
	if err := write(&out, usages, true); err != nil {
		t.Fatal(err)
	}
	rows, err := csv.NewReader(&out).ReadAll()
	if err != nil || len(rows) != 3 || rows[0][0] != statement.Columns[0] {
		t.Fatalf("CSV: %v, %q", err, rows)
	}
	if one, err := statement.Read(ctx, c, "team-a", "2026-02"); err != nil || len(one) != 1 || one[0].Spec.Period != "2026-02" {
		t.Errorf("one tenant: %v %v", one, err)
	}
	if _, err := statement.Read(ctx, c, "team-c", "2026-03"); err == nil || !strings.Contains(err.Error(), "tenant team-c") {
		t.Errorf("no usage: %v", err)
	}
}
