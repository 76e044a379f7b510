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

func TestGpuProfileIsEnabled(t *testing.T) {
	off := false
	if !(&GpuProfile{}).IsEnabled() || (&GpuProfile{Spec: GpuProfileSpec{Enabled: &off}}).IsEnabled() {
		t.Fatal("IsEnabled: unset must mean enabled, false disabled")
	}
}
