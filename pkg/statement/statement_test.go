package statement

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller/billing"
)

var march = time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)

func mt(d time.Duration) metav1.Time { return metav1.NewTime(march.Add(d)) }

// usage is team-a's March: two closed 1g slices (1/7 unit, 3.5 hours in
// all, at 7.00 a unit-hour) on two nodes, a whole H100 open since day 2 at
// 2.50 (10 hours observed), and a shape's instance at 4. Their use: the
// slices on n1 in use 1200 s and idle 600 s, on n2 written before uses
// were recorded (unknown); the H100 5 hours in use, 4 idle, 1 unknown; the
// shape in use throughout.
func usage() *gpuaas.TenantUsage {
	last := mt(24*time.Hour + 10*time.Hour)
	return &gpuaas.TenantUsage{
		Spec: gpuaas.TenantUsageSpec{Tenant: "team-a", Period: "2026-03", Start: metav1.NewTime(march), End: metav1.NewTime(march.AddDate(0, 1, 0))},
		Status: gpuaas.TenantUsageStatus{Currency: "EUR",
			Totals: []gpuaas.UsageTotal{
				{Profile: "mig-1g", GpuModel: "NVIDIA H100 80GB HBM3", Node: "n1", Price: resource.MustParse("7"), Records: 2, UnitSeconds: "1800",
					UsedUnitSeconds: "1200", IdleUnitSeconds: "600", UnknownUseUnitSeconds: "0", Cost: "3.500000"},
				{Profile: "mig-1g", GpuModel: "NVIDIA H100 80GB HBM3", Node: "n2", Price: resource.MustParse("7"), Records: 1, UncertainRecords: 1, UnitSeconds: "1800", Cost: "3.500000"},
				{Profile: "whole", Shape: "pair", GpuModel: "NVIDIA A100-SXM4-40GB", Node: "n3", Price: resource.MustParse("4"), Records: 1, UnitSeconds: "7200", UsedUnitSeconds: "7200", Cost: "8.000000"},
			},
			Open: []gpuaas.UsageRecord{{Tenant: "team-a", Namespace: "a", Claim: "big", Device: "n1/gpu-0", Profile: "whole",
				GpuModel: "NVIDIA H100 80GB HBM3", Node: "n1", Units: "1", Start: mt(24 * time.Hour), LastSeen: last,
				UnitSeconds: "36000", UsedUnitSeconds: "18000", IdleUnitSeconds: "14400", UnknownUseUnitSeconds: "3600",
				Price: resource.MustParse("2.50"), Cost: "25.000000"}},
		},
	}
}

func TestStatementText(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteText(&buf, FromUsage(usage())); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	t.Logf("\n%s", out)
	if want := "Statement of tenant team-a for 2026-03 (2026-03-01 to 2026-03-31 UTC), as of 2026-03-02T10:00:00Z"; !strings.Contains(out, want) {
		t.Errorf("statement lacks %q", want)
	}
	// The table's cells are separated by two spaces or more.
	rows := map[string]string{}
	for _, line := range strings.Split(out, "\n")[1:] {
		cells := regexp.MustCompile(`\s{2,}`).Split(strings.TrimSpace(line), -1)
		rows[cells[0]+" "+cells[min(1, len(cells)-1)]] = strings.Join(cells, "|")
	}
	for key, want := range map[string]string{
		"GpuProfile mig-1g": "GpuProfile|mig-1g|NVIDIA H100 80GB HBM3|7|1.000000|0.333333|0.166667|0.500000|7.000000|1.166667|3|0",
		"GpuProfile whole":  "GpuProfile|whole|NVIDIA H100 80GB HBM3|2.5|10.000000|5.000000|4.000000|1.000000|25.000000|10.000000|0|1",
		"GpuShape pair":     "GpuShape|pair|NVIDIA A100-SXM4-40GB|4|2.000000|2.000000|0.000000|0.000000|8.000000|0.000000|1|0",
		"TOTAL 13.000000":   "TOTAL|13.000000|7.333333|4.166667|1.500000|40.000000 EUR|11.166667 EUR",
	} {
		if rows[key] != want {
			t.Errorf("row %s = %q, want %q", key, rows[key], want)
		}
	}
}

// TestStatementCSVReadsBack: the CSV is read back with a CSV reader, by
// its FOCUS column names, and its rows add up to the records.
func TestStatementCSVReadsBack(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteCSV(&buf, FromUsage(usage())); err != nil {
		t.Fatal(err)
	}
	rows, err := csv.NewReader(&buf).ReadAll()
	if err != nil {
		t.Fatalf("reading the CSV back: %v", err)
	}
	if len(rows) != 4 || strings.Join(rows[0], ",") != strings.Join(Columns, ",") {
		t.Fatalf("header %q and %d rows", rows[0], len(rows)-1)
	}
	col := map[string]int{}
	for i, name := range rows[0] {
		col[name] = i
		// FOCUS's own columns up to Tags; custom ones are x_ prefixed.
		if i > slices.Index(Columns, "Tags") && !strings.HasPrefix(name, "x_") {
			t.Errorf("custom column %q lacks FOCUS's x_ prefix", name)
		}
	}
	byName := map[string][]string{}
	for _, r := range rows[1:] {
		byName[r[col["ResourceName"]]] = r
		for _, name := range []string{"BillingPeriodStart", "BillingPeriodEnd", "ChargePeriodStart", "ChargePeriodEnd"} {
			if _, err := time.Parse(time.RFC3339, r[col[name]]); err != nil {
				t.Errorf("%s %q: %v", name, r[col[name]], err)
			}
		}
		var tags map[string]any
		if err := json.Unmarshal([]byte(r[col["Tags"]]), &tags); err != nil {
			t.Errorf("Tags %q is not JSON: %v", r[col["Tags"]], err)
		}
		if r[col["BillingCurrency"]] != "EUR" || r[col["SubAccountId"]] != "team-a" || r[col["ServiceName"]] != ServiceName ||
			r[col["ChargeCategory"]] != "Usage" || r[col["PricingUnit"]] != Unit || r[col["BilledCost"]] != r[col["EffectiveCost"]] {
			t.Errorf("row %q", r)
		}
	}
	whole := byName["whole"]
	if whole == nil || whole[col["BilledCost"]] != "25.000000" || whole[col["ConsumedQuantity"]] != "10.000000" ||
		whole[col["ListUnitPrice"]] != "2.5" || whole[col["ResourceType"]] != "GpuProfile" ||
		whole[col["BillingPeriodStart"]] != "2026-03-01T00:00:00Z" || whole[col["BillingPeriodEnd"]] != "2026-04-01T00:00:00Z" ||
		whole[col["ChargePeriodEnd"]] != "2026-03-02T10:00:00Z" || whole[col["ResourceId"]] != "gpuaas.io/tenants/team-a/gpuprofiles/whole" ||
		whole[col["x_UsedQuantity"]] != "5.000000" || whole[col["x_IdleQuantity"]] != "4.000000" ||
		whole[col["x_UnknownUseQuantity"]] != "1.000000" || whole[col["x_IdleCost"]] != "10.000000" {
		t.Errorf("row of whole: %q", whole)
	}
	slice := byName["mig-1g"]
	var tags map[string]any
	_ = json.Unmarshal([]byte(slice[col["Tags"]]), &tags)
	if slice[col["BilledCost"]] != "7.000000" || slice[col["x_UnknownUseQuantity"]] != "0.500000" || tags["gpuaas.io/records"] != float64(3) || tags["gpuaas.io/uncertain-records"] != float64(1) ||
		tags["gpuaas.io/gpu-model"] != "NVIDIA H100 80GB HBM3" {
		t.Errorf("row of mig-1g (two nodes, one line): %q", slice)
	}
	if shape := byName["pair"]; shape == nil || shape[col["ResourceType"]] != "GpuShape" || shape[col["BilledCost"]] != "8.000000" {
		t.Errorf("row of the shape: %q", shape)
	}
}

// The statement reads the TenantUsage by the name the recorder writes.
func TestUsageNameIsTheRecorders(t *testing.T) {
	if a, b := UsageName("team-a", "2026-03"), billing.UsageName("team-a", "2026-03"); a != b {
		t.Errorf("statement reads %s, the recorder writes %s", a, b)
	}
}
