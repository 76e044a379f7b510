package controller

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/cache/informertest"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	crwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/gpuaas/gpu-dra-driver/pkg/controller/webhook"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller/webhookcert"
	"github.com/gpuaas/gpu-dra-driver/pkg/quota"
)

func TestMetricsRegistered(t *testing.T) {
	registerMetrics()
	registerMetrics() // a second controller in the process must not panic
	webhook.StartTenantSeries("t", quota.Limits{Units: ptr.To(quota.NewUnits(1, 1))})
	families, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"gpuaas_claim_admissions_total": false, "gpuaas_claim_denials_total": false}
	for _, f := range families {
		if f.GetName() == "gpuaas_webhook_duration_seconds" {
			t.Error("gpuaas_webhook_duration_seconds duplicates controller_runtime_webhook_latency_seconds")
		}
	}
	for _, f := range families {
		if _, ok := want[f.GetName()]; ok {
			want[f.GetName()] = true
		}
	}
	for name, found := range want {
		if !found {
			t.Errorf("metric %s not on the controller-runtime registry", name)
		}
	}
}

// The webhook server answers over HTTP/1.1 even to a client that prefers
// HTTP/2, as the kube-apiserver does: only then does the apiserver spread
// reviews over the replicas behind the Service.
func TestWebhookServerSpeaksHTTP1Only(t *testing.T) {
	dir := t.TempDir()
	// Self-signed, as a single process without a Secret makes them.
	if _, err := webhookcert.Ensure(ctx(t), nil, &webhookcert.Config{CertDir: dir, IPs: []string{"127.0.0.1"}}, time.Now()); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	srv := crwebhook.NewServer(crwebhook.Options{Host: "127.0.0.1", Port: port, CertDir: dir,
		TLSOpts: []func(*tls.Config){webhookHTTP1Only}})
	go func() { _ = srv.Start(ctx(t)) }()
	var state tls.ConnectionState
	err = wait.PollUntilContextTimeout(ctx(t), 50*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		conn, err := tls.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port),
			&tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2", "http/1.1"}}) //nolint:gosec // a local test server
		if err != nil {
			return false, nil
		}
		defer func() { _ = conn.Close() }()
		state = conn.ConnectionState()
		return true, nil
	})
	if err != nil {
		t.Fatalf("webhook server never answered: %v", err)
	}
	if state.NegotiatedProtocol != "http/1.1" {
		t.Fatalf("negotiated %q with a client offering h2; want http/1.1", state.NegotiatedProtocol)
	}
}

// Issue 12 item 7: a replica whose informers have not synced is not ready,
// so the Service sends it no reviews (they would wait out the apiserver's
// webhook timeout).
func TestNotReadyUntilCachesSync(t *testing.T) {
	informers := &informertest.FakeInformers{Synced: ptr.To(false)}
	check := cachesSynced(informers)
	probe := httptest.NewRequest(http.MethodGet, "/readyz", nil)
	if err := check(probe); err == nil {
		t.Fatal("ready before the caches synced")
	}
	informers.Synced = ptr.To(true)
	if err := check(probe); err != nil {
		t.Fatalf("not ready with synced caches: %v", err)
	}
}
