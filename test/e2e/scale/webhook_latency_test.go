package scale

import (
	"context"
	"fmt"
	"testing"

	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

const (
	// claimWebhookPath and claimWebhookName: the claim webhook as the
	// controller and the API server label it (pkg/controller/webhook).
	claimWebhookPath = "/validate-resourceclaim"
	claimWebhookName = "resourceclaims.quota.gpuaas.io"
)

// webhookLatency is the claim webhook's part of a run, from two
// histograms: the controller's own (controller-runtime's handler time,
// decade buckets) and the API server's (the call as it makes it: TLS, the
// connection and the handler; buckets from 5 ms to 25 s).
type webhookLatency struct {
	controller, apiserver framework.Histogram
}

// claimWebhookLatency reads both histograms now.
func claimWebhookLatency(tb testing.TB, ctx context.Context, c *controller) webhookLatency {
	tb.Helper()
	own, err := framework.ScrapeHistogram(ctx, c.metricsURL, "controller_runtime_webhook_latency_seconds", map[string]string{"webhook": claimWebhookPath})
	if err != nil {
		tb.Fatalf("the controller's webhook latency: %v", err)
	}
	body, err := cp.Client.CoreV1().RESTClient().Get().AbsPath("/metrics").Stream(ctx)
	if err != nil {
		tb.Fatalf("the API server's metrics: %v", err)
	}
	defer func() { _ = body.Close() }()
	seen, err := framework.ParseHistogram(body, "apiserver_admission_webhook_admission_duration_seconds", map[string]string{"name": claimWebhookName})
	if err != nil {
		tb.Fatalf("the API server's webhook latency: %v", err)
	}
	return webhookLatency{controller: own, apiserver: seen}
}

// since is what the webhook took between before and l.
func (l webhookLatency) since(before webhookLatency) webhookLatency {
	return webhookLatency{controller: l.controller.Since(before.controller), apiserver: l.apiserver.Since(before.apiserver)}
}

// controllerMeanMs is the controller's mean time per review, in ms.
func (l webhookLatency) controllerMeanMs() float64 { return l.controller.Mean() * 1000 }

func (l webhookLatency) String() string {
	return fmt.Sprintf("%.0f reviews, in the controller mean %.2f ms, p99 at most %s; as the API server calls it %.0f, mean %.2f ms, p99 at most %s",
		l.controller.Count, l.controllerMeanMs(), bound(l.controller.QuantileBound(0.99)),
		l.apiserver.Count, l.apiserver.Mean()*1000, bound(l.apiserver.QuantileBound(0.99)))
}

// bound prints a bucket bound in ms.
func bound(seconds float64) string {
	return fmt.Sprintf("%g ms", seconds*1000)
}
