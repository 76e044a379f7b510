package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller"
	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

// TestControllerReclaimAgainstTheBorrowersOwnIdentity (issue 55 routes 2
// and 7), against the real API server: a borrower's ServiceAccount holds
// its cohort's quota with claims it made by hand. Reclaim leaves them
// alone (nothing would make them again) until the admin opts the borrower's
// standalone claims in; the borrower then puts a finalizer of its own on
// them, which keeps the deleted claim but not the quota: the lender is
// admitted while the claim waits on the finalizer.
func TestControllerReclaimAgainstTheBorrowersOwnIdentity(t *testing.T) {
	rc := startControllerWith(t, func(o *controller.Options) { o.ReclaimUnallocatedAfter = 2 * time.Second })
	ctx := framework.Context(t, 3*time.Minute)
	name := uniqueName("reclaim")
	product := "E2E Reclaim GPU " + name
	createObject(t, profile(name, gpuaas.ProfileSelector{Type: gpuaas.DeviceTypeGPU, ProductName: product}))
	waitForProfileReady(t, name)
	var gpus []resourceapi.Device
	for i := range 2 {
		gpus = append(gpus, e2eShapeGPU(fmt.Sprintf("gpu-%d", i), product, "pci0000:00"))
	}
	createObject(t, e2eSlice(name+"-gpus", "gpu.gpuaas.io", name+"-node", gpus))
	borrowerNS, lenderNS := cp.CreateNamespace(t, "borrower"), cp.CreateNamespace(t, "lender")
	borrower, err := cp.NewTenant(ctx, borrowerNS, "team")
	if err != nil {
		t.Fatal(err)
	}
	borrowerQuota, lenderQuota := quotaFor(name+"-b", []string{borrowerNS}, gpuaas.QuotaLimits{GpuUnits: units("1")}),
		quotaFor(name+"-l", []string{lenderNS}, gpuaas.QuotaLimits{GpuUnits: units("1")})
	borrowerQuota.Spec.Cohort, lenderQuota.Spec.Cohort = name, name
	createObject(t, borrowerQuota)
	createObject(t, lenderQuota)
	claims := borrower.Client.ResourceV1().ResourceClaims(borrowerNS)
	// Its own unit, then the lender's idle one: bare claims no pod uses.
	var last error
	for _, n := range []string{"own", "borrowed"} {
		err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			_, last = claims.Create(ctx, gpuClaim(borrowerNS, n, name, 1), metav1.CreateOptions{})
			return last == nil, nil
		})
		if err != nil {
			t.Fatalf("the borrower's claim %s: %v", n, last)
		}
	}
	t.Cleanup(func() { dropFinalizers(t, borrowerNS, "own", "borrowed") })
	time.Sleep(3 * time.Second) // past reclaimUnallocatedAfter

	// Standalone, not opted in: kept, and the lender waits.
	mustDeny(t, createClaim(ctx, gpuClaim(lenderNS, "lender-1", name, 1)), "has lent it out", "do not cover it: it waits")
	for _, n := range []string{"own", "borrowed"} {
		if _, err := claims.Get(ctx, n, metav1.GetOptions{}); err != nil {
			t.Fatalf("the borrower's standalone claim %s: %v; want it kept", n, err)
		}
	}

	// The borrower guards its claims with a finalizer; the admin opts its
	// standalone claims in to reclaim.
	for _, n := range []string{"own", "borrowed"} {
		patch := []byte(`{"metadata":{"finalizers":["borrower.example.com/hold"]}}`)
		if _, err := claims.Patch(ctx, n, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			t.Fatalf("the borrower adding its finalizer to %s: %v", n, err)
		}
	}
	onConflictRetry(t, "opting the borrower in", func() error {
		var q gpuaas.TenantQuota
		if err := ctrlClient.Get(ctx, types.NamespacedName{Name: borrowerQuota.Name}, &q); err != nil {
			return err
		}
		q.Spec.ReclaimStandaloneClaims = true
		return ctrlClient.Update(ctx, &q)
	})
	// The lender is admitted once a claim is deleted, finalizer or not.
	err = wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		last = createClaim(ctx, gpuClaim(lenderNS, "lender-2", name, 1))
		if last != nil && !strings.Contains(last.Error(), "has lent it out") {
			return false, last
		}
		return last == nil, nil
	})
	if err != nil {
		t.Fatalf("the lender stayed locked out while its borrower's claim waited on a finalizer: %v (last: %v)", err, last)
	}
	deleting := 0
	for _, n := range []string{"own", "borrowed"} {
		c, err := claims.Get(ctx, n, metav1.GetOptions{})
		if err == nil && c.DeletionTimestamp != nil {
			deleting++
		}
	}
	if deleting != 1 {
		t.Errorf("%d of the borrower's claims are being deleted, want 1 (the finalizer keeps it)", deleting)
	}
	rc.alive(t)
}

// dropFinalizers removes the finalizers a test's tenant put on its claims,
// so that its namespace can go.
func dropFinalizers(t *testing.T, namespace string, names ...string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, n := range names {
		_, err := cp.Client.ResourceV1().ResourceClaims(namespace).Patch(ctx, n, types.MergePatchType,
			[]byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("removing the finalizers of %s/%s: %v", namespace, n, err)
		}
	}
}
