package v1alpha1

import (
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// BudgetAction is what happens once a tenant's spend reaches its budget.
// +kubebuilder:validation:Enum=Notify;RefuseNewClaims
type BudgetAction string

const (
	// BudgetActionNotify only reports: the conditions, an event per
	// threshold and the metrics (and so the alerts).
	BudgetActionNotify BudgetAction = "Notify"
	// BudgetActionRefuseNewClaims has the claim webhook refuse the
	// tenant's new claims that cost anything, with a message naming the
	// budget, until the period ends or the budget is raised. Claims that
	// exist are never touched.
	BudgetActionRefuseNewClaims BudgetAction = "RefuseNewClaims"
)

// DefaultBudgetThresholds are the thresholds of a budget that lists none,
// in percent of its amount.
var DefaultBudgetThresholds = []int32{50, 80, 100}

// Budget is what a tenant may spend per billing period (a UTC calendar
// month, the TenantUsage's), in the controller's billing currency.
type Budget struct {
	// Amount per period, in the billing currency ("1000", "250.50").
	// +kubebuilder:validation:XValidation:rule="quantity(string(self)).isGreaterThan(quantity('0'))",message="budget.amount must be positive"
	Amount resource.Quantity `json:"amount"`
	// Thresholds, in percent of the amount, at which the controller sets
	// the BudgetThresholdReached condition and raises an event, once per
	// threshold and period. Unset: 50, 80 and 100.
	// +kubebuilder:validation:MaxItems=10
	// +kubebuilder:validation:items:Minimum=1
	// +kubebuilder:validation:items:Maximum=1000
	// +listType=set
	// +optional
	Thresholds []int32 `json:"thresholds,omitempty"`
	// Action once the spend reaches the amount (100%): Notify (the
	// default) or RefuseNewClaims.
	// +optional
	Action BudgetAction `json:"action,omitempty"`
}

// EffectiveThresholds are the budget's thresholds, sorted, the defaults
// when none is set.
func (b *Budget) EffectiveThresholds() []int32 {
	if len(b.Thresholds) == 0 {
		return append([]int32(nil), DefaultBudgetThresholds...)
	}
	out := append([]int32(nil), b.Thresholds...)
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && out[j] < out[j-1]; j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out
}

// BudgetStatus is the spend of the current period against the budget, as
// the controller's leader last computed it from the TenantUsage records.
type BudgetStatus struct {
	// Period is the UTC month, yyyy-mm.
	Period string `json:"period"`
	// Spent is the period's cost so far, to six decimals.
	Spent string `json:"spent"`
	// Amount is the budget the spend was compared with.
	Amount resource.Quantity `json:"amount"`
	// Currency of both.
	// +optional
	Currency string `json:"currency,omitempty"`
	// Percent is spent / amount, in percent, rounded down.
	Percent int64 `json:"percent"`
	// ThresholdsCrossed in this period, each once: the event of a
	// threshold is raised when it is added here.
	// +listType=set
	// +optional
	ThresholdsCrossed []int32 `json:"thresholdsCrossed,omitempty"`
}

// Condition types and reasons of a TenantQuota's budget.
const (
	// ConditionBudgetThresholdReached: the spend of the period reached a
	// threshold of the budget; the message names the highest.
	ConditionBudgetThresholdReached = "BudgetThresholdReached"
	// ConditionBudgetExhausted: the spend reached the amount; with action
	// RefuseNewClaims new claims are refused.
	ConditionBudgetExhausted = "BudgetExhausted"

	ReasonBelowThresholds  = "BelowThresholds"
	ReasonThresholdCrossed = "ThresholdCrossed"
	ReasonWithinBudget     = "WithinBudget"
	ReasonBudgetExhausted  = "Exhausted"
	// ReasonNoBudget: the quota has no budget (the conditions stay, False).
	ReasonNoBudget = "NoBudget"
)

// TenantBilling is who reads a tenant's billing. A TenantUsage is
// cluster-scoped, so a tenant's admins (admins of its namespaces) cannot
// read it; the controller grants the readers listed here get on this
// tenant's TenantUsages only, by name, and nothing else: a ClusterRole and
// ClusterRoleBinding named gpuaas-billing-reader-<tenant>, owned by the
// TenantQuota (a TenantQuota is written only by the platform's admins, so a
// tenant cannot add itself to another's readers).
// +kubebuilder:validation:XValidation:rule="!has(self.readers) || self.readers.all(s, s.kind in ['User', 'Group', 'ServiceAccount'])",message="a reader's kind is User, Group or ServiceAccount"
// +kubebuilder:validation:XValidation:rule="!has(self.readers) || self.readers.all(s, s.kind != 'ServiceAccount' || (has(s.__namespace__) && size(s.__namespace__) > 0 && (!has(s.apiGroup) || size(s.apiGroup) == 0)))",message="a ServiceAccount reader names its namespace, and no apiGroup"
type TenantBilling struct {
	// Readers may get the tenant's TenantUsages, each month's (what
	// `kubectl gpuaas statement --tenant <name>` reads): users, groups or
	// ServiceAccounts, as in a RoleBinding's subjects. They cannot list
	// TenantUsages, so the statement needs --tenant.
	// +kubebuilder:validation:MaxItems=32
	// +listType=atomic
	// +optional
	Readers []rbacv1.Subject `json:"readers,omitempty"`
}
