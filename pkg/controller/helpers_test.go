package controller

import (
	"context"
	"testing"

	dto "github.com/prometheus/client_model/go"

	"github.com/gpuaas/gpu-dra-driver/pkg/controller/internal/testworld"
	"github.com/gpuaas/gpu-dra-driver/pkg/quota"
)

// The fixtures are testworld's, under the names these tests use.
var (
	tenantQuota   = testworld.TenantQuota
	teamQuota     = testworld.TeamQuota
	qty           = testworld.Qty
	ns            = testworld.Namespace
	claim         = testworld.Claim
	allocatedTo   = testworld.AllocatedTo
	world         = testworld.World
	newFakeClient = testworld.NewFakeClient
)

func ctx(t testing.TB) context.Context { return t.Context() }

func quotaUnits(n, d int64) quota.Units { return quota.NewUnits(n, d) }

func counterValue(t *testing.T, tenant string) float64 {
	t.Helper()
	var m dto.Metric
	if err := unitSeconds.WithLabelValues(tenant).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}
