package v1alpha1

import (
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func qty(s string) *resource.Quantity { q := resource.MustParse(s); return &q }

func TestTenantQuotaValidate(t *testing.T) {
	tests := []struct {
		name string
		spec TenantQuotaSpec
		want []string // empty: valid
	}{
		{"valid", TenantQuotaSpec{Namespaces: []string{"a"}, Cohort: "c",
			Limits:         QuotaLimits{GpuUnits: qty("2.5"), GpuMemory: qty("160Gi"), Devices: map[string]int64{"h100": 2}},
			BorrowingLimit: &BorrowingLimit{GpuUnits: qty("0")}}, nil},
		{"selector only", TenantQuotaSpec{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "a"}}}, nil},
		{"no namespaces", TenantQuotaSpec{}, []string{"spec.namespaces", "set namespaces or namespaceSelector"}},
		{"negative units", TenantQuotaSpec{Namespaces: []string{"a"}, Limits: QuotaLimits{GpuUnits: qty("-1")}},
			[]string{"spec.limits.gpuUnits", "must not be negative"}},
		{"negative device limit", TenantQuotaSpec{Namespaces: []string{"a"}, Limits: QuotaLimits{Devices: map[string]int64{"h100": -1}}},
			[]string{"spec.limits.devices[h100]"}},
		{"negative shape limit", TenantQuotaSpec{Namespaces: []string{"a"}, Limits: QuotaLimits{Shapes: map[string]int64{"h100-slot": -1}}},
			[]string{"spec.limits.shapes[h100-slot]", "must not be negative"}},
		{"borrowing without cohort", TenantQuotaSpec{Namespaces: []string{"a"}, BorrowingLimit: &BorrowingLimit{GpuMemory: qty("-1Gi")}},
			[]string{"spec.cohort", "spec.borrowingLimit.gpuMemory"}},
		{"bad selector", TenantQuotaSpec{NamespaceSelector: &metav1.LabelSelector{
			MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "x", Operator: "Near"}}}},
			[]string{"spec.namespaceSelector"}},
		{"idle policy", TenantQuotaSpec{Namespaces: []string{"a"}, IdlePolicy: &IdlePolicy{Duration: metav1.Duration{Duration: time.Hour},
			Warning: &metav1.Duration{Duration: time.Minute}, Action: IdleActionEvict,
			ExemptNamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"gpuaas.io/idle-exempt": "true"}}}}, nil},
		{"idle policy with a bad exemption", TenantQuotaSpec{Namespaces: []string{"a"}, IdlePolicy: &IdlePolicy{
			Duration: metav1.Duration{Duration: time.Hour}, Action: IdleActionNotify,
			ExemptNamespaceSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "x", Operator: "Near"}}}}},
			[]string{"spec.idlePolicy.exemptNamespaceSelector"}},
		{"idle policy with a negative warning", TenantQuotaSpec{Namespaces: []string{"a"}, IdlePolicy: &IdlePolicy{
			Duration: metav1.Duration{Duration: time.Hour}, Warning: &metav1.Duration{Duration: -time.Minute}, Action: IdleActionEvict}},
			[]string{"spec.idlePolicy.warning", "must not be negative"}},
		{"budget", TenantQuotaSpec{Namespaces: []string{"a"}, Budget: &Budget{Amount: *qty("1000"), Thresholds: []int32{50, 90, 120},
			Action: BudgetActionRefuseNewClaims}}, nil},
		{"budget of zero", TenantQuotaSpec{Namespaces: []string{"a"}, Budget: &Budget{Amount: *qty("0")}},
			[]string{"spec.budget.amount", "must be positive"}},
		{"budget with bad thresholds", TenantQuotaSpec{Namespaces: []string{"a"}, Budget: &Budget{Amount: *qty("10"),
			Thresholds: []int32{0, 80, 80, 2000}}},
			[]string{"spec.budget.thresholds[0]", "spec.budget.thresholds[2]: Duplicate", "spec.budget.thresholds[3]", "between 1 and 1000"}},
		{"budget with an unknown action", TenantQuotaSpec{Namespaces: []string{"a"}, Budget: &Budget{Amount: *qty("10"), Action: "Stop"}},
			[]string{"spec.budget.action", `"Stop"`, "RefuseNewClaims"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q := &TenantQuota{ObjectMeta: metav1.ObjectMeta{Name: "q"}, Spec: tt.spec}
			errs := q.Validate()
			if len(tt.want) == 0 {
				if len(errs) > 0 {
					t.Fatalf("unexpected: %v", errs)
				}
				return
			}
			msg := errs.ToAggregate().Error()
			for _, w := range tt.want {
				if !strings.Contains(msg, w) {
					t.Errorf("%q lacks %q", msg, w)
				}
			}
		})
	}
}

func TestBudgetEffectiveThresholds(t *testing.T) {
	if got := (&Budget{}).EffectiveThresholds(); len(got) != 3 || got[0] != 50 || got[2] != 100 {
		t.Errorf("default thresholds %v", got)
	}
	if got := (&Budget{Thresholds: []int32{90, 20, 50}}).EffectiveThresholds(); got[0] != 20 || got[1] != 50 || got[2] != 90 {
		t.Errorf("sorted thresholds %v", got)
	}
}

func TestPriceValidate(t *testing.T) {
	if errs := (&Price{PerGpuUnitHour: *qty("-1")}).Validate(nil); len(errs) != 1 || !strings.Contains(errs[0].Error(), "must not be negative") {
		t.Errorf("negative price: %v", errs)
	}
	if errs := (&Price{PerGpuUnitHour: *qty("0")}).Validate(nil); len(errs) != 0 {
		t.Errorf("zero price: %v", errs)
	}
}

func TestGpuProfileIsEnabled(t *testing.T) {
	off := false
	if !(&GpuProfile{}).IsEnabled() || (&GpuProfile{Spec: GpuProfileSpec{Enabled: &off}}).IsEnabled() {
		t.Fatal("IsEnabled: unset must mean enabled, false disabled")
	}
}
