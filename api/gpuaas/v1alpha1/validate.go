package v1alpha1

import (
	"fmt"
	"sort"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Validate checks what the CRD schema cannot (or what objects stored before
// the schema tightened may still carry), so the controller never acts on a
// quota it misreads. The errors name the field.
func (q *TenantQuota) Validate() field.ErrorList {
	spec := field.NewPath("spec")
	var errs field.ErrorList
	if len(q.Spec.Namespaces) == 0 && q.Spec.NamespaceSelector == nil {
		errs = append(errs, field.Required(spec.Child("namespaces"), "set namespaces or namespaceSelector"))
	}
	if sel := q.Spec.NamespaceSelector; sel != nil {
		if _, err := metav1.LabelSelectorAsSelector(sel); err != nil {
			errs = append(errs, field.Invalid(spec.Child("namespaceSelector"), sel, err.Error()))
		}
	}
	limits := spec.Child("limits")
	errs = append(errs, nonNegative(limits.Child("gpuUnits"), q.Spec.Limits.GpuUnits)...)
	errs = append(errs, nonNegative(limits.Child("gpuMemory"), q.Spec.Limits.GpuMemory)...)
	errs = append(errs, validDeviceLimits(limits.Child("devices"), q.Spec.Limits.Devices)...)
	errs = append(errs, validDeviceLimits(limits.Child("shapes"), q.Spec.Limits.Shapes)...)
	if b := q.Spec.BorrowingLimit; b != nil {
		path := spec.Child("borrowingLimit")
		if q.Spec.Cohort == "" {
			errs = append(errs, field.Required(spec.Child("cohort"), "borrowingLimit requires a cohort"))
		}
		errs = append(errs, nonNegative(path.Child("gpuUnits"), b.GpuUnits)...)
		errs = append(errs, nonNegative(path.Child("gpuMemory"), b.GpuMemory)...)
	}
	errs = append(errs, q.Spec.IdlePolicy.Validate(spec.Child("idlePolicy"))...)
	errs = append(errs, q.Spec.Budget.Validate(spec.Child("budget"))...)
	return errs
}

// Validate checks a budget at path: a positive amount, thresholds between
// 1 and 1000 percent without repeats, a known action. A nil budget is
// valid.
func (b *Budget) Validate(path *field.Path) field.ErrorList {
	if b == nil {
		return nil
	}
	var errs field.ErrorList
	if b.Amount.Sign() <= 0 {
		errs = append(errs, field.Invalid(path.Child("amount"), b.Amount.String(), "must be positive"))
	}
	if len(b.Thresholds) > 10 {
		errs = append(errs, field.TooMany(path.Child("thresholds"), len(b.Thresholds), 10))
	}
	seen := map[int32]bool{}
	for i, t := range b.Thresholds {
		switch {
		case t < 1 || t > 1000:
			errs = append(errs, field.Invalid(path.Child("thresholds").Index(i), t, "must be between 1 and 1000 (percent of the amount)"))
		case seen[t]:
			errs = append(errs, field.Duplicate(path.Child("thresholds").Index(i), t))
		}
		seen[t] = true
	}
	switch b.Action {
	case "", BudgetActionNotify, BudgetActionRefuseNewClaims:
	default:
		errs = append(errs, field.NotSupported(path.Child("action"), b.Action,
			[]BudgetAction{BudgetActionNotify, BudgetActionRefuseNewClaims}))
	}
	return errs
}

// Validate checks a price at path: not negative (a negative price would
// make the cost counters go down). A nil price is valid.
func (p *Price) Validate(path *field.Path) field.ErrorList {
	if p == nil {
		return nil
	}
	return nonNegative(path.Child("perGpuUnitHour"), &p.PerGpuUnitHour)
}

// Validate checks what the CRD schema does not of an idle policy at path:
// an exemption selector that parses (the controller exempts nothing it
// cannot read) and a warning that is not negative. A nil policy is valid.
func (p *IdlePolicy) Validate(path *field.Path) field.ErrorList {
	if p == nil {
		return nil
	}
	var errs field.ErrorList
	if sel := p.ExemptNamespaceSelector; sel != nil {
		if _, err := metav1.LabelSelectorAsSelector(sel); err != nil {
			errs = append(errs, field.Invalid(path.Child("exemptNamespaceSelector"), sel, err.Error()))
		}
	}
	if w := p.Warning; w != nil && w.Duration < 0 {
		errs = append(errs, field.Invalid(path.Child("warning"), w.Duration.String(), "must not be negative"))
	}
	return errs
}

func nonNegative(path *field.Path, q *resource.Quantity) field.ErrorList {
	if q != nil && q.Sign() < 0 {
		return field.ErrorList{field.Invalid(path, q.String(), "must not be negative")}
	}
	return nil
}

func validDeviceLimits(path *field.Path, limits map[string]int64) field.ErrorList {
	names := make([]string, 0, len(limits))
	for name := range limits {
		names = append(names, name)
	}
	sort.Strings(names)
	var errs field.ErrorList
	for _, name := range names {
		if limits[name] < 0 {
			errs = append(errs, field.Invalid(path.Key(name), limits[name], "must not be negative"))
		}
	}
	return errs
}

// Claims reports whether the quota names namespace explicitly.
func (q *TenantQuota) Claims(namespace string) bool {
	for _, ns := range q.Spec.Namespaces {
		if ns == namespace {
			return true
		}
	}
	return false
}

// String is a short description for log and error messages.
func (q *TenantQuota) String() string {
	return fmt.Sprintf("TenantQuota %q", q.Name)
}
