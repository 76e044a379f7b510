package admission

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
)

// Issue 26 item 8: the books of tenants and cohorts no TenantQuota names
// were never deleted. The sweeper deletes them once their reservations
// lapsed; the books in use, and an unused one still holding a
// reservation, stay; and the deleted tenant's book comes back when an
// admission needs it again.
func TestSweeperDeletesUnusedLapsedBooks(t *testing.T) {
	acct, api := newAccountant(t, append(world(t), ns("a", nil), ns("b", nil), teamQuota("team-a", "a", "4"), teamQuota("team-b", "b", "4"))...)
	for _, c := range []struct{ ns, name string }{{"a", "a1"}, {"b", "b1"}} {
		if adm, err := acct.Admit(ctx(t), claim(c.ns, c.name, "h100", 1), false); err != nil || !adm.Allowed {
			t.Fatalf("%s: %+v, %v", c.name, adm, err)
		}
	}
	gone := &gpuaas.TenantQuota{}
	if err := api.Get(ctx(t), client.ObjectKey{Name: "team-b"}, gone); err != nil {
		t.Fatal(err)
	}
	if err := api.Delete(ctx(t), gone); err != nil {
		t.Fatal(err)
	}
	s := &bookSweeper{client: api, namespace: "gpuaas", now: time.Now}
	book := func(name string) error {
		return api.Get(ctx(t), client.ObjectKey{Namespace: "gpuaas", Name: name}, &corev1.ConfigMap{})
	}
	if err := s.sweep(ctx(t)); err != nil {
		t.Fatal(err)
	}
	if err := book("gpuaas-quota-tenant-team-b"); err != nil {
		t.Fatalf("team-b's book, still holding a reservation: %v", err)
	}
	s.now = shiftedClock(reservationGrace + time.Second)
	if err := s.sweep(ctx(t)); err != nil {
		t.Fatal(err)
	}
	if err := book("gpuaas-quota-tenant-team-b"); !apierrors.IsNotFound(err) {
		t.Errorf("team-b's lapsed book of a deleted quota: %v, want it deleted", err)
	}
	if err := book("gpuaas-quota-tenant-team-a"); err != nil {
		t.Errorf("team-a's book, in use: %v", err)
	}

	// team-b comes back; this replica still holds the deleted book.
	if err := api.Create(ctx(t), teamQuota("team-b", "b", "4")); err != nil {
		t.Fatal(err)
	}
	acct.invalidateTenancy()
	if adm, err := acct.Admit(ctx(t), claim("b", "b2", "h100", 1), false); err != nil || !adm.Allowed {
		t.Fatalf("after its book was swept: %+v, %v", adm, err)
	}
	if err := book("gpuaas-quota-tenant-team-b"); err != nil {
		t.Errorf("team-b's book was not written again: %v", err)
	}
}

// Issue 27: a book that cannot be written fails its admissions closed,
// and nothing counted it; gpuaas_quota_ledger_errors_total does.
func TestLedgerErrorsAreCounted(t *testing.T) {
	api := newFakeClient(t, append(world(t), ns("a", nil), teamQuota("team-a", "a", "4"))...)
	failing := interceptor.NewClient(api, interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			if _, ok := obj.(*corev1.ConfigMap); ok {
				return apierrors.NewForbidden(corev1.Resource("configmaps"), obj.GetName(), errors.New("denied"))
			}
			return c.Create(ctx, obj, opts...)
		},
	})
	acct := NewAccountant(api, api, NewLedger(failing, "gpuaas"))
	before := testutil.ToFloat64(ledgerErrors)
	if _, err := acct.Admit(ctx(t), claim("a", "c", "h100", 1), false); err == nil {
		t.Fatal("admitted with a book that cannot be written")
	}
	if got := testutil.ToFloat64(ledgerErrors) - before; got != 1 {
		t.Errorf("gpuaas_quota_ledger_errors_total grew by %v, want 1", got)
	}
}
