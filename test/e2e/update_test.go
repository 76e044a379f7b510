package e2e

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

// conflictBackoff is how long a test keeps retrying a write that lost a
// race: the controller, the kube-apiserver's own controllers and
// cert-controller write the objects tests change (status, finalizers,
// conditions), so a Get then an Update conflicts now and then, more often on
// a loaded machine. About 10 s in all, far past any one status write.
var conflictBackoff = wait.Backoff{Steps: 20, Duration: 50 * time.Millisecond, Factor: 1.3, Jitter: 0.2, Cap: time.Second}

// onConflictRetry runs write (which must read the object again itself)
// until it does not conflict.
func onConflictRetry(t testing.TB, what string, write func() error) {
	t.Helper()
	if err := retry.RetryOnConflict(conflictBackoff, write); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// updateObject reads obj again, applies change to it and writes it, until
// the write does not conflict; obj holds what was written.
func updateObject[T client.Object](t testing.TB, ctx context.Context, obj T, change func(T)) {
	t.Helper()
	key := client.ObjectKeyFromObject(obj)
	// installCRDs makes the client: a test run alone may not have made it yet.
	c := installCRDs(t)
	onConflictRetry(t, "updating "+key.String(), func() error {
		if err := c.Get(ctx, key, obj); err != nil {
			return err
		}
		change(obj)
		return c.Update(ctx, obj)
	})
}

// TestUpdateObjectOutlastsAStatusWriter: a spec change made while another
// writer keeps the status moving lands every time. Before issue 41 the tests
// read and wrote such objects once (TestRedTeam/RerunCreateHoldsQuota failed
// on "the object has been modified" while the controller wrote the
// TenantQuota's status); with the plain Get and Update this test fails
// within its twenty changes.
func TestUpdateObjectOutlastsAStatusWriter(t *testing.T) {
	installCRDs(t)
	ctx := framework.Context(t, 2*time.Minute)
	name := uniqueName("conflict")
	q := quotaFor(name, []string{name}, gpuaas.QuotaLimits{GpuUnits: units("1")})
	createObject(t, q)

	// The other writer: the status, as fast as the API answers.
	writerCtx, stopWriter := context.WithCancel(ctx)
	var writes atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		for writerCtx.Err() == nil {
			var cur gpuaas.TenantQuota
			if ctrlClient.Get(writerCtx, client.ObjectKeyFromObject(q), &cur) != nil {
				continue
			}
			cur.Status.ClaimsCounted++
			if ctrlClient.Status().Update(writerCtx, &cur) == nil {
				writes.Add(1)
			}
		}
	}()
	const changes = 20
	for i := range changes {
		updateObject(t, ctx, q, func(q *gpuaas.TenantQuota) { q.Spec.Limits.GpuUnits = units(strconv.Itoa(i + 2)) })
	}
	stopWriter()
	<-done
	var got gpuaas.TenantQuota
	if err := ctrlClient.Get(ctx, client.ObjectKeyFromObject(q), &got); err != nil {
		t.Fatal(err)
	}
	if want := units(strconv.Itoa(changes + 1)); got.Spec.Limits.GpuUnits.Cmp(*want) != 0 {
		t.Errorf("gpuUnits after %d changes: %s, want %s", changes, got.Spec.Limits.GpuUnits, want)
	}
	if writes.Load() == 0 {
		t.Fatal("the status writer never wrote: nothing raced the changes")
	}
	t.Logf("%d changes landed beside %d status writes", changes, writes.Load())
}
