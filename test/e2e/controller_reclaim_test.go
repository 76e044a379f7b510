package e2e

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	resourceclient "k8s.io/client-go/kubernetes/typed/resource/v1"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller"
	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

// reclaimWorld is a cohort of two tenants of one GPU unit each over two
// GPUs: a borrower, acting as its own ServiceAccount, and a lender.
type reclaimWorld struct {
	class                string
	borrowerNS, lenderNS string
	borrowerQuota        string
	// claims are the borrower's ResourceClaims, as its ServiceAccount.
	claims resourceclient.ResourceClaimInterface
}

// newReclaimWorld makes the world; standalone says whether the borrower's
// TenantQuota opts its standalone claims in to reclaim from the start.
func newReclaimWorld(t *testing.T, ctx context.Context, standalone bool) *reclaimWorld {
	t.Helper()
	name := uniqueName("reclaim")
	product := "E2E Reclaim GPU " + name
	createObject(t, profile(name, gpuaas.ProfileSelector{Type: gpuaas.DeviceTypeGPU, ProductName: product})) //nolint:contextcheck // the test helpers clean up after the test, past its context
	waitForProfileReady(t, name)                                                                             //nolint:contextcheck // the test helpers clean up after the test, past its context
	var gpus []resourceapi.Device
	for i := range 2 {
		gpus = append(gpus, e2eShapeGPU(fmt.Sprintf("gpu-%d", i), product, "pci0000:00"))
	}
	createObject(t, e2eSlice(name+"-gpus", "gpu.gpuaas.io", name+"-node", gpus))                                              //nolint:contextcheck // the test helpers clean up after the test, past its context
	w := &reclaimWorld{class: name, borrowerNS: cp.CreateNamespace(t, "borrower"), lenderNS: cp.CreateNamespace(t, "lender")} //nolint:contextcheck // the test helpers clean up after the test, past its context
	borrower, err := cp.NewTenant(ctx, w.borrowerNS, "team")
	if err != nil {
		t.Fatal(err)
	}
	w.claims = borrower.Client.ResourceV1().ResourceClaims(w.borrowerNS)
	borrowerQuota, lenderQuota := quotaFor(name+"-b", []string{w.borrowerNS}, gpuaas.QuotaLimits{GpuUnits: units("1")}),
		quotaFor(name+"-l", []string{w.lenderNS}, gpuaas.QuotaLimits{GpuUnits: units("1")})
	borrowerQuota.Spec.Cohort, lenderQuota.Spec.Cohort = name, name
	borrowerQuota.Spec.ReclaimStandaloneClaims = standalone
	w.borrowerQuota = borrowerQuota.Name
	createObject(t, borrowerQuota) //nolint:contextcheck // the test helpers clean up after the test, past its context
	createObject(t, lenderQuota)   //nolint:contextcheck // the test helpers clean up after the test, past its context
	return w
}

// borrow has the borrower create bare claims no pod uses, of one GPU each,
// in order: "own" takes its unit, the next ones the lender's idle unit.
func (w *reclaimWorld) borrow(t *testing.T, ctx context.Context, names ...string) {
	t.Helper()
	var last error
	for _, n := range names {
		err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			_, last = w.claims.Create(ctx, gpuClaim(w.borrowerNS, n, w.class, 1), metav1.CreateOptions{})
			return last == nil, nil
		})
		if err != nil {
			t.Fatalf("the borrower's claim %s: %v", n, last)
		}
	}
}

// lenderAdmitted retries the lender's claim of one GPU, while it is refused
// for its lent quota, for up to within; the error is the last answer.
func (w *reclaimWorld) lenderAdmitted(ctx context.Context, name string, within time.Duration) error {
	var last error
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, within, true, func(ctx context.Context) (bool, error) {
		err := createClaim(ctx, gpuClaim(w.lenderNS, name, w.class, 1))
		var status apierrors.APIStatus
		if err != nil && !errors.As(err, &status) {
			return false, nil // the client's (the poll's deadline), not an answer
		}
		if last = err; err != nil && !strings.Contains(err.Error(), "has lent it out") {
			return false, err
		}
		return err == nil, nil
	})
	if err != nil {
		return fmt.Errorf("%w (last answer: %w)", err, last)
	}
	return nil
}

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
	w := newReclaimWorld(t, ctx, false)
	claims, borrowerNS := w.claims, w.borrowerNS
	// Its own unit, then the lender's idle one: bare claims no pod uses.
	w.borrow(t, ctx, "own", "borrowed")
	t.Cleanup(func() { dropFinalizers(t, borrowerNS, "own", "borrowed") })
	time.Sleep(3 * time.Second) // past reclaimUnallocatedAfter

	// Standalone, not opted in: kept, and the lender waits.
	mustDeny(t, createClaim(ctx, gpuClaim(w.lenderNS, "lender-1", w.class, 1)), "has lent it out", "do not cover it: it waits")
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
		if err := ctrlClient.Get(ctx, types.NamespacedName{Name: w.borrowerQuota}, &q); err != nil {
			return err
		}
		q.Spec.ReclaimStandaloneClaims = true
		return ctrlClient.Update(ctx, &q)
	})
	// The lender is admitted once a claim is deleted, finalizer or not.
	if err := w.lenderAdmitted(ctx, "lender-2", time.Minute); err != nil {
		t.Fatalf("the lender stayed locked out while its borrower's claim waited on a finalizer: %v", err)
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

// relabelEvery is how often the borrower of
// TestControllerReclaimAgainstARelabellingBorrower patches each claim.
const relabelEvery = 100 * time.Millisecond

// TestControllerReclaimAgainstARelabellingBorrower (issue 55 route 3),
// against the real API server: the borrower's ServiceAccount patches a
// label on each of its idle claims every relabelEvery while the lender asks
// for its own quota back. A reclaim delete preconditioned on the
// resourceVersion judged conflicted, was taken for "allocated or deleted
// meanwhile", and the reclaim for the lender stayed "under way" for its
// reservation's 35 s with nothing deleted: the lender must be admitted
// within 30 s, so within that one reclaim.
func TestControllerReclaimAgainstARelabellingBorrower(t *testing.T) {
	rc := startControllerWith(t, func(o *controller.Options) { o.ReclaimUnallocatedAfter = 2 * time.Second })
	ctx := framework.Context(t, 3*time.Minute)
	w := newReclaimWorld(t, ctx, true)
	w.borrow(t, ctx, "own", "borrowed")
	loop, stop := context.WithCancel(ctx)
	var patched atomic.Int64
	var relabellers sync.WaitGroup
	for _, n := range []string{"own", "borrowed"} {
		relabellers.Go(func() { w.relabel(loop, n, &patched) })
	}
	time.Sleep(3 * time.Second) // past reclaimUnallocatedAfter, relabelled all along
	before := patched.Load()
	err := w.lenderAdmitted(ctx, "lender", 30*time.Second)
	stop()
	relabellers.Wait()
	if err != nil {
		t.Fatalf("the lender stayed locked out by a borrower relabelling its idle claims: %v", err)
	}
	t.Logf("the borrower relabelled its claims %d times, %d of them while the lender asked", patched.Load(), patched.Load()-before)
	if patched.Load() == before {
		t.Fatal("the borrower's relabelling stopped before the lender asked: the test proves nothing")
	}
	left, err := w.claims.List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(left.Items) != 1 {
		t.Errorf("the borrower holds %d claims, want 1: the reclaim deletes the borrowed one", len(left.Items))
	}
	rc.alive(t)
}

// relabel patches a label on the borrower's claim, as its ServiceAccount,
// every relabelEvery until ctx ends or the claim is gone; patched counts
// the writes that landed.
func (w *reclaimWorld) relabel(ctx context.Context, name string, patched *atomic.Int64) {
	tick := time.NewTicker(relabelEvery)
	defer tick.Stop()
	for i := 0; ; i++ {
		patch := fmt.Appendf(nil, `{"metadata":{"labels":{"relabel":"%d"}}}`, i)
		_, err := w.claims.Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{})
		switch {
		case err == nil:
			patched.Add(1)
		case apierrors.IsNotFound(err):
			return // reclaimed
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
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
