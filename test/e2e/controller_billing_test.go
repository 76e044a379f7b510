package e2e

import (
	"context"
	"fmt"
	"math/big"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller/billing"
	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

// TestControllerBillingRecords: claims of two kinds (a whole GPU and a 1g
// slice, each profile priced) allocated by the scheduler, the controller
// restarted while they run, then deleted: the tenant's TenantUsage has one
// record per allocated device, opened when the allocation was seen and
// closed when it went, each billed once at its units and price.
func TestControllerBillingRecords(t *testing.T) {
	node := fakeGPUNode(t, wholeDevice("gpu-0"), migDevice("gpu-1-mig-1g-0", "1g.10gb", 1, "10Gi"))
	rc := startController(t)
	ctx := framework.Context(t, 4*time.Minute)
	ns := cp.CreateNamespace(t, "billing")
	whole, slice, tenant := uniqueName("whole"), uniqueName("slice"), uniqueName("tenant")
	for name, sel := range map[string]gpuaas.ProfileSelector{whole: {Type: gpuaas.DeviceTypeGPU}, slice: {MigProfile: "1g.10gb"}} {
		p := profile(name, sel)
		p.Spec.Price = &gpuaas.Price{PerGpuUnitHour: resource.MustParse("7")}
		createObject(t, p)
	}
	createObject(t, quotaFor(tenant, []string{ns}, gpuaas.QuotaLimits{GpuUnits: units("2")}))
	waitForQuota(t, tenant, "enforced", func(q *gpuaas.TenantQuota) bool { return len(q.Status.Namespaces) == 1 })

	type held struct {
		device, units   string
		allocated, gone time.Time // what the test saw, to the second
	}
	claims := map[string]*held{"one-whole": {units: "1"}, "one-slice": {units: "1/7"}}
	for name, class := range map[string]string{"one-whole": whole, "one-slice": slice} {
		if err := createClaim(ctx, gpuClaim(ns, name, class, 1)); err != nil {
			t.Fatalf("claim %s: %v", name, err)
		}
		if _, err := cp.Client.CoreV1().Pods(ns).Create(ctx, claimPod(ns, name, name, ""), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		c := waitForAllocation(t, ctx, ns, name)
		claims[name].allocated = time.Now().Truncate(time.Second)
		claims[name].device = node + "/" + c.Status.Allocation.Devices.Results[0].Device
	}
	usageName := billing.UsageName(tenant, time.Now().UTC().Format("2006-01"))
	waitForUsage(t, usageName, "two open records", func(u *gpuaas.TenantUsage) bool { return len(u.Status.Open) == 2 })

	// A new leader goes on from the records in the API.
	rc.stop(t)
	time.Sleep(2 * time.Second) // no leader for a while
	restarted := time.Now().Add(time.Second).Truncate(time.Second)
	startController(t)
	// Deleted before the new leader saw them, they would be billed up to
	// the old leader's last observation only (endUncertain, as
	// TestClaimGoneWhileNoLeaderClosesAtLastSeen shows): the test waits
	// until the new leader continued both records.
	waitForUsage(t, usageName, "both records continued by the new leader", func(u *gpuaas.TenantUsage) bool {
		return len(u.Status.Open) == 2 && !u.Status.Open[0].LastSeen.Before(&metav1.Time{Time: restarted}) &&
			!u.Status.Open[1].LastSeen.Before(&metav1.Time{Time: restarted})
	})

	for name := range claims {
		if err := cp.Client.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
			t.Fatal(err)
		}
		if err := cp.Client.ResourceV1().ResourceClaims(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		waitForClaimGone(t, ctx, ns, name)
		claims[name].gone = time.Now().Add(time.Second).Truncate(time.Second)
	}
	u := waitForUsage(t, usageName, "both records closed", func(u *gpuaas.TenantUsage) bool {
		return len(u.Status.Open) == 0 && len(u.Status.Recent) == 2
	})
	total := new(big.Rat)
	for _, rec := range u.Status.Recent {
		h := claims[rec.Claim]
		if h == nil || rec.Device != h.device || rec.Units != h.units || rec.End == nil || rec.EndUncertain {
			t.Fatalf("record %+v; want claim %s's device %+v, closed for certain", rec, rec.Claim, h)
		}
		// Opened once the allocation was seen (before the test saw it, or
		// a resync later at most), closed between the deletion and when
		// the test saw the claim gone.
		if rec.Start.After(h.allocated.Add(5*time.Second)) || rec.End.After(h.gone.Add(5*time.Second)) || !rec.End.After(rec.Start.Time) {
			t.Errorf("record %s: [%v, %v); the test allocated it at %v and saw it gone at %v", rec.Claim, rec.Start.Time, rec.End.Time, h.allocated, h.gone)
		}
		want, _ := new(big.Rat).SetString(h.units)
		want.Mul(want, big.NewRat(int64(rec.End.Sub(rec.Start.Time)/time.Second), 1))
		if got, _ := new(big.Rat).SetString(rec.UnitSeconds); got.Cmp(want) != 0 {
			t.Errorf("record %s: %s unit-seconds, want %s: its units over [start, end), once", rec.Claim, rec.UnitSeconds, want.RatString())
		}
		total.Add(total, want)
	}
	if u.Status.UnitSeconds != total.RatString() || u.Status.Currency != "USD" {
		t.Errorf("TenantUsage: %s unit-seconds in %s, want %s in USD", u.Status.UnitSeconds, u.Status.Currency, total.RatString())
	}
}

func waitForUsage(t testing.TB, name, what string, cond func(*gpuaas.TenantUsage) bool) *gpuaas.TenantUsage {
	t.Helper()
	ctx := framework.Context(t, time.Minute)
	var u gpuaas.TenantUsage
	err := wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		if err := ctrlClient.Get(ctx, types.NamespacedName{Name: name}, &u); err != nil {
			return false, client.IgnoreNotFound(err)
		}
		return cond(&u), nil
	})
	if err != nil {
		t.Fatalf("TenantUsage %s not %s: %v; status %+v", name, what, err, u.Status)
	}
	return &u
}

func waitForClaimGone(t *testing.T, ctx context.Context, namespace, name string) {
	t.Helper()
	err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		_, err := cp.Client.ResourceV1().ResourceClaims(namespace).Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
	})
	if err != nil {
		t.Fatal(fmt.Errorf("claim %s/%s not gone: %w", namespace, name, err))
	}
}
