package main

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/statement"
)

// reportStatements prints what `kubectl gpuaas statement` prints for the
// tenants with usage this month (the TenantUsage records the controller
// wrote while the demo ran), each tenant's budget, and how many rows its
// CSV export has.
func (d *demo) reportStatements(ctx context.Context) error {
	c, err := d.client()
	if err != nil {
		return err
	}
	var usages gpuaas.TenantUsageList
	if err := c.List(ctx, &usages); err != nil {
		return fmt.Errorf("listing TenantUsages: %w", err)
	}
	var quotas gpuaas.TenantQuotaList
	if err := c.List(ctx, &quotas); err != nil {
		return fmt.Errorf("listing TenantQuotas: %w", err)
	}
	period := time.Now().UTC().Format("2006-01")
	d.out.printf("\nStatements (kubectl gpuaas statement --period %s), from the TenantUsage records:\n", period)
	for _, line := range statementLines(usages.Items, quotas.Items, period) {
		d.out.printf("  %s\n", line)
	}
	return nil
}

// statementLines are the period's statements, one tenant after the other,
// each followed by its budget and its CSV's row count.
func statementLines(usages []gpuaas.TenantUsage, quotas []gpuaas.TenantQuota, period string) []string {
	var of []gpuaas.TenantUsage
	for _, u := range usages {
		if u.Spec.Period == period {
			of = append(of, u)
		}
	}
	slices.SortFunc(of, func(a, b gpuaas.TenantUsage) int { return strings.Compare(a.Spec.Tenant, b.Spec.Tenant) })
	if len(of) == 0 {
		return []string{"no usage recorded (no claim of a tenant was allocated)"}
	}
	budgets := map[string]*gpuaas.TenantQuota{}
	for i := range quotas {
		budgets[quotas[i].Name] = &quotas[i]
	}
	var out []string
	for i := range of {
		s := statement.FromUsage(&of[i])
		var text, csv bytes.Buffer
		if err := statement.WriteText(&text, s); err != nil {
			out = append(out, fmt.Sprintf("%s: %v", s.Tenant, err))
			continue
		}
		out = append(out, strings.Split(strings.TrimRight(text.String(), "\n"), "\n")...)
		if q := budgets[s.Tenant]; q != nil && q.Spec.Budget != nil {
			out = append(out, budgetLine(q))
		}
		if err := statement.WriteCSV(&csv, s); err == nil {
			out = append(out, fmt.Sprintf("--csv: %d rows of FOCUS %s columns (%s, ...)", strings.Count(csv.String(), "\n")-1,
				statement.FOCUSVersion, strings.Join(statement.Columns[:4], ", ")))
		}
		out = append(out, "")
	}
	return out[:len(out)-1]
}

// budgetLine is a quota's budget as its status says.
func budgetLine(q *gpuaas.TenantQuota) string {
	b := q.Spec.Budget
	st := q.Status.Budget
	if st == nil {
		return fmt.Sprintf("budget %s (%s): not judged yet", b.Amount.String(), actionOf(b))
	}
	return fmt.Sprintf("budget %s %s (%s): spent %s, %d%%, thresholds crossed %v", st.Amount.String(), st.Currency, actionOf(b),
		st.Spent, st.Percent, st.ThresholdsCrossed)
}

func actionOf(b *gpuaas.Budget) gpuaas.BudgetAction {
	if b.Action == "" {
		return gpuaas.BudgetActionNotify
	}
	return b.Action
}
