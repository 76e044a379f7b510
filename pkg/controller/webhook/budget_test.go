package webhook

import (
	"net/http"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
)

// overBudget is team-a over namespace a, whose budget of 100 the billing
// recorder found exhausted in period.
func overBudget(action gpuaas.BudgetAction, period string) *gpuaas.TenantQuota {
	q := teamQuota("team-a", "a", "4")
	q.Spec.Budget = &gpuaas.Budget{Amount: resource.MustParse("100"), Action: action}
	q.Status.Budget = &gpuaas.BudgetStatus{Period: period, Spent: "100.500000", Amount: resource.MustParse("100"), Currency: "EUR", Percent: 100}
	q.Status.Conditions = []metav1.Condition{{Type: gpuaas.ConditionBudgetExhausted, Status: metav1.ConditionTrue,
		Reason: gpuaas.ReasonBudgetExhausted, LastTransitionTime: metav1.Now()}}
	return q
}

// TestClaimWebhookRefusesOverBudget: with action RefuseNewClaims an
// exhausted budget refuses the tenant's new claims, naming the budget; with
// Notify, or once the period is over, or below the budget, they are
// admitted.
func TestClaimWebhookRefusesOverBudget(t *testing.T) {
	period := time.Now().UTC().Format("2006-01")
	for _, tc := range []struct {
		name  string
		quota *gpuaas.TenantQuota
		allow bool
	}{
		{"RefuseNewClaims, exhausted", overBudget(gpuaas.BudgetActionRefuseNewClaims, period), false},
		{"Notify, exhausted", overBudget(gpuaas.BudgetActionNotify, period), true},
		{"RefuseNewClaims, last period's", overBudget(gpuaas.BudgetActionRefuseNewClaims, "2000-01"), true},
		{"RefuseNewClaims, budget raised since", func() *gpuaas.TenantQuota {
			q := overBudget(gpuaas.BudgetActionRefuseNewClaims, period)
			q.Spec.Budget.Amount = resource.MustParse("200")
			return q
		}(), true},
		{"RefuseNewClaims, within budget", func() *gpuaas.TenantQuota {
			q := overBudget(gpuaas.BudgetActionRefuseNewClaims, period)
			q.Status.Conditions[0].Status = metav1.ConditionFalse
			return q
		}(), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			acct, _ := newAccountant(t, append(world(t), ns("a", nil), tc.quota)...)
			h, _ := newClaimWebhook(t, acct)
			c := claim("a", "train", "h100", 1)
			resp := h.Handle(ctx(t), request(t, admissionv1.Create, "a", c.Name, c))
			if resp.Allowed != tc.allow {
				t.Fatalf("allowed %v, want %v: %+v", resp.Allowed, tc.allow, resp.Result)
			}
			if !tc.allow && (resp.Result.Code != http.StatusForbidden ||
				!strings.Contains(resp.Result.Message, `the budget of TenantQuota "team-a" for `+period+` is exhausted (spent 100.500000 EUR of 100)`)) {
				t.Errorf("refusal does not name the budget: %+v", resp.Result)
			}
		})
	}
}
