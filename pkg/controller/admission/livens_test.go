package admission

import (
	"context"
	"testing"
	"time"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// blockingReader is the live API for namespaces, stalled until released.
type blockingReader struct {
	client.Reader
	started chan struct{}
	release chan struct{}
}

func (r *blockingReader) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if _, ok := obj.(*corev1.Namespace); ok {
		close(r.started)
		<-r.release
	}
	return r.Reader.Get(ctx, key, obj, opts...)
}

// A claim in a namespace the cache has not seen yet waits for a live read
// of the namespace; that read must not hold the accountant's lock, or every
// admission of every tenant waits behind it.
func TestLiveNamespaceReadDoesNotStallOtherAdmissions(t *testing.T) {
	byLabel := tenantQuota("team-new", 0, gpuaas.TenantQuotaSpec{
		NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "new"}},
		Limits:            gpuaas.QuotaLimits{GpuUnits: qty("1")}})
	objs := append(world(t), ns("a", nil), teamQuota("team-a", "a", "2"), byLabel)
	cache := newFakeClient(t, objs...)
	// Created a moment ago with the tenant's label: not cached yet.
	api := newFakeClient(t, append(objs, ns("fresh", map[string]string{"team": "new"}))...)
	live := &blockingReader{Reader: api, started: make(chan struct{}), release: make(chan struct{})}
	acct := NewAccountant(cache, live, NewLedger(cache, "gpuaas"))

	fresh := make(chan Admission, 1)
	go func() {
		adm, err := acct.Admit(ctx(t), claim("fresh", "c", "h100", 2), false)
		if err != nil {
			t.Error(err)
		}
		fresh <- adm
	}()
	<-live.started
	admitsWhileStalled(t, acct, live.release, "an admission in a cached namespace waited for another namespace's live read")
	adm := <-fresh
	if adm.Allowed || adm.Tenant != "team-new" {
		t.Fatalf("claim of 2 GPUs in the fresh namespace: %+v, want denied by team-new (limit 1)", adm)
	}
}

// admitsWhileStalled admits a one-GPU claim in namespace "a" while another
// admission is stalled, failing with why unless it finishes within 5 s;
// then it releases the stalled one.
func admitsWhileStalled(t *testing.T, acct *Accountant, release chan struct{}, why string) {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		_, err := acct.Admit(ctx(t), claim("a", "c", "h100", 1), false)
		done <- err
	}()
	defer close(release)
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal(why)
	}
}
