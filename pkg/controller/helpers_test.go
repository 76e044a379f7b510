package controller

import (
	"context"
	"testing"

	"github.com/gpuaas/gpu-dra-driver/pkg/controller/internal/testworld"
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
