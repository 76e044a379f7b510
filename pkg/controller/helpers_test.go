package controller

import (
	"context"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpuaas/gpu-dra-driver/pkg/controller/internal/testworld"
	"github.com/gpuaas/gpu-dra-driver/pkg/quota"
)

// The fixtures are testworld's, under the names these tests use.
const driver = testworld.Driver

var (
	attr          = testworld.Attr
	intAttr       = testworld.IntAttr
	wholeGPU      = testworld.WholeGPU
	mig1g         = testworld.Mig1g
	resourceSlice = testworld.ResourceSlice
	gpuProfile    = testworld.GpuProfile
	classOf       = testworld.ClassOf
	tenantQuota   = testworld.TenantQuota
	qty           = testworld.Qty
	ns            = testworld.Namespace
	claim         = testworld.Claim
	allocatedTo   = testworld.AllocatedTo
	ownedByPod    = testworld.OwnedByPod
	world         = testworld.World
	newFakeClient = testworld.NewFakeClient
)

func newAccountant(t testing.TB, objs ...client.Object) (*Accountant, client.WithWatch) {
	c := newFakeClient(t, objs...)
	return NewAccountant(c, c, NewLedger(c, "gpuaas")), c
}

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
