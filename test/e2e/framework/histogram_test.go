package framework

import (
	"context"
	"fmt"
	"math"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// TestAHistogramSplitsOutWhatARunObserved: a histogram scraped before and
// after a run gives the run's own observations (those before it do not
// count), summed over the series that match, with the quantile's bucket
// bound and the mean.
func TestAHistogramSplitsOutWhatARunObserved(t *testing.T) {
	reg := prometheus.NewRegistry()
	latency := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "webhook_latency_seconds", Buckets: []float64{0.005, 0.01, 0.1, 1},
	}, []string{"webhook", "code"})
	reg.MustRegister(latency)
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	ctx := context.Background()
	claims := map[string]string{"webhook": "/validate-resourceclaim"}

	// Before the run: slow calls, and another webhook's.
	for range 10 {
		latency.WithLabelValues("/validate-resourceclaim", "200").Observe(0.5)
	}
	latency.WithLabelValues("/validate-gpuprofile", "200").Observe(2)
	before, err := ScrapeHistogram(ctx, srv.URL, "webhook_latency_seconds", claims)
	if err != nil {
		t.Fatal(err)
	}
	// The run: 98 fast calls over two codes, two of 50 ms.
	for i := range 98 {
		latency.WithLabelValues("/validate-resourceclaim", fmt.Sprint(200+i%2)).Observe(0.002)
	}
	latency.WithLabelValues("/validate-resourceclaim", "200").Observe(0.05)
	latency.WithLabelValues("/validate-resourceclaim", "200").Observe(0.05)
	latency.WithLabelValues("/validate-gpuprofile", "200").Observe(3)
	after, err := ScrapeHistogram(ctx, srv.URL, "webhook_latency_seconds", claims)
	if err != nil {
		t.Fatal(err)
	}
	run := after.Since(before)
	if run.Count != 100 {
		t.Errorf("the run observed %v calls, want 100", run.Count)
	}
	if got := run.QuantileBound(0.50); got != 0.005 {
		t.Errorf("p50 bound %v, want 0.005", got)
	}
	if got := run.QuantileBound(0.99); got != 0.1 {
		t.Errorf("p99 bound %v, want 0.1 (the two 50 ms calls)", got)
	}
	if got, want := run.Mean(), (98*0.002+2*0.05)/100; math.Abs(got-want) > 1e-9 {
		t.Errorf("mean %v, want %v", got, want)
	}
	if got := after.QuantileBound(0.99); got != 1 {
		t.Errorf("p99 bound of everything %v, want 1 (the 500 ms calls before the run)", got)
	}
	none, err := ScrapeHistogram(ctx, srv.URL, "webhook_latency_seconds", map[string]string{"webhook": "/never-called"})
	if err != nil || none.Count != 0 || !math.IsNaN(none.QuantileBound(0.99)) {
		t.Errorf("a webhook never called: %+v, %v; want an empty histogram", none, err)
	}
}
