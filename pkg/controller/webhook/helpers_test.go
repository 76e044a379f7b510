package webhook

import (
	"context"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/client"

	quotaadmission "github.com/gpuaas/gpu-dra-driver/pkg/controller/admission"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller/internal/testworld"
)

// The fixtures are testworld's, under the names these tests use.
const driver = testworld.Driver

var (
	wholeGPU      = testworld.WholeGPU
	mig1g         = testworld.Mig1g
	resourceSlice = testworld.ResourceSlice
	gpuProfile    = testworld.GpuProfile
	classOf       = testworld.ClassOf
	tenantQuota   = testworld.TenantQuota
	teamQuota     = testworld.TeamQuota
	qty           = testworld.Qty
	ns            = testworld.Namespace
	claim         = testworld.Claim
	allocatedTo   = testworld.AllocatedTo
	ownedByPod    = testworld.OwnedByPod
	world         = testworld.World
	newFakeClient = testworld.NewFakeClient
)

// The Kueue fixtures.
const (
	kcmUser    = testworld.KCMUser
	tenantUser = testworld.TenantUser
)

var (
	jobRef           = testworld.JobRef
	gpuPod           = testworld.GPUPod
	kueuePod         = testworld.KueuePod
	kueueWorkloadObj = testworld.KueueWorkload
	workload         = testworld.Workload
	kcmClaim         = testworld.KCMClaim
	withAlternatives = testworld.WithAlternatives
	genericClass     = testworld.GenericClass
)

func newAccountant(t testing.TB, objs ...client.Object) (*quotaadmission.Accountant, client.WithWatch) {
	c := newFakeClient(t, objs...)
	return quotaadmission.NewAccountant(c, c, quotaadmission.NewLedger(c, "gpuaas")), c
}

func ctx(t testing.TB) context.Context { return t.Context() }
