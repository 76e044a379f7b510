package controller

import (
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller/admission"
	"github.com/gpuaas/gpu-dra-driver/pkg/quota"
)

// Used, reserved and limit are metrics of their own (one gauge with a
// "kind" label made sum() add a tenant's limit to its usage), and a limit
// or a profile that is gone leaves no stale series.
func TestTenantMetricsAreSeparateGauges(t *testing.T) {
	q := &gpuaas.TenantQuota{ObjectMeta: metav1.ObjectMeta{Name: "team-m"}}
	r := admission.TenantReport{
		Tenant: quota.Tenant{Name: "team-m", Limits: quota.Limits{Units: ptr.To(quota.NewUnits(4, 1)), Devices: map[string]int64{"h100": 2}}},
		Usage: quota.Usage{
			Used:     quota.Charge{Units: quota.NewUnits(3, 2), Memory: 80 << 30, Devices: map[string]int64{"h100": 1}},
			Reserved: quota.Charge{Units: quota.NewUnits(1, 7)},
		},
	}
	setTenantMetrics(q, r, quota.Charge{})
	for g, want := range map[string]float64{"used": 1.5, "reserved": 1.0 / 7, "limit": 4} {
		v := map[string]float64{
			"used": testutil.ToFloat64(tenantUnitsUsed.WithLabelValues("team-m")), "reserved": testutil.ToFloat64(tenantUnitsReserved.WithLabelValues("team-m")),
			"limit": testutil.ToFloat64(tenantUnitsLimit.WithLabelValues("team-m")),
		}[g]
		if v != want {
			t.Errorf("gpu units %s = %v, want %v", g, v, want)
		}
	}
	if got := testutil.ToFloat64(tenantDevUsed.WithLabelValues("team-m", "h100")); got != 1 {
		t.Errorf("devices used = %v, want 1", got)
	}
	r.Tenant.Limits = quota.Limits{} // limits removed from the quota
	r.Usage.Used.Devices = nil
	setTenantMetrics(q, r, quota.Charge{})
	if n := testutil.CollectAndCount(tenantUnitsLimit); n != 0 {
		t.Errorf("%d gpu unit limit series left after the limit was removed", n)
	}
	if n := testutil.CollectAndCount(tenantDevLimit); n != 0 {
		t.Errorf("%d device limit series left after the limit was removed", n)
	}
	if n := testutil.CollectAndCount(tenantDevUsed); n != 0 {
		t.Errorf("%d device usage series left after the profile went", n)
	}
	deleteTenantMetrics("team-m")
	if n := testutil.CollectAndCount(tenantUnitsUsed); n != 0 {
		t.Errorf("%d series left after the tenant was deleted", n)
	}
}

// BenchmarkTenantMetricsAt1000Tenants: a status update of one tenant among
// 1,000 (each with two profiles). Deleting a tenant's series by partial
// match scanned all 1,000 tenants' series per update.
func BenchmarkTenantMetricsAt1000Tenants(b *testing.B) {
	r := admission.TenantReport{
		Tenant: quota.Tenant{Limits: quota.Limits{Units: ptr.To(quota.NewUnits(4, 1)), Devices: map[string]int64{"h100": 2, "a100": 1}}},
		Usage:  quota.Usage{Used: quota.Charge{Devices: map[string]int64{"h100": 1, "a100": 1}}},
	}
	names := make([]string, 1000)
	for i := range names {
		names[i] = fmt.Sprintf("bench-tenant-%d", i)
		setTenantMetrics(&gpuaas.TenantQuota{ObjectMeta: metav1.ObjectMeta{Name: names[i]}}, r, quota.Charge{})
	}
	b.Cleanup(func() {
		for _, n := range names {
			deleteTenantMetrics(n)
		}
	})
	b.ResetTimer()
	for i := range b.N {
		setTenantMetrics(&gpuaas.TenantQuota{ObjectMeta: metav1.ObjectMeta{Name: names[i%len(names)]}}, r, quota.Charge{})
	}
}
