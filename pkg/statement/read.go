package statement

import (
	"context"
	"fmt"
	"slices"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
)

// UsageName is the name the controller's recorder gives the TenantUsage of
// tenant and period (pkg/controller/billing.UsageName).
func UsageName(tenant, period string) string { return tenant + "-" + period }

// Read is the period's TenantUsage of tenant, or of every tenant when
// tenant is empty (sorted by tenant). A tenant's billing readers
// (TenantQuota spec.billing.readers) may get their tenant's by name and
// list none, so they name the tenant.
func Read(ctx context.Context, c client.Reader, tenant, period string) ([]gpuaas.TenantUsage, error) {
	if tenant != "" {
		var u gpuaas.TenantUsage
		if err := c.Get(ctx, client.ObjectKey{Name: UsageName(tenant, period)}, &u); err != nil {
			return nil, fmt.Errorf("reading the TenantUsage of tenant %s for %s: %w", tenant, period, err)
		}
		return []gpuaas.TenantUsage{u}, nil
	}
	var list gpuaas.TenantUsageList
	if err := c.List(ctx, &list); err != nil {
		if apierrors.IsForbidden(err) {
			return nil, fmt.Errorf("listing TenantUsages (a tenant's billing readers read only their own: pass --tenant): %w", err)
		}
		return nil, fmt.Errorf("listing TenantUsages: %w", err)
	}
	var out []gpuaas.TenantUsage
	for _, u := range list.Items {
		if u.Spec.Period == period {
			out = append(out, u)
		}
	}
	slices.SortFunc(out, func(a, b gpuaas.TenantUsage) int { return strings.Compare(a.Spec.Tenant, b.Spec.Tenant) })
	return out, nil
}
