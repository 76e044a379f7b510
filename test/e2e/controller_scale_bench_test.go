package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

// BenchmarkControllerAtScale (issue 14 item 4) runs the dra-controller
// binary against the real control plane with SCALE_TENANTS TenantQuotas
// (default 1,000, in two cohorts) holding SCALE_CLAIMS claims (default
// 10,000), then creates claims at SCALE_RATE per second (default 200) for
// 5 s and reports:
//
//   - the webhook's own latency: the fraction of admissions under 5 ms
//     (controller-runtime's webhook latency histogram has a bucket there,
//     so the p99 < 5 ms budget is met exactly when it is >= 0.99) and the
//     create latency the client sees (apiserver, webhook, book write,
//     etcd);
//
//   - the controller's resident memory (peak and current);
//
//   - the time a restarted controller takes to answer the webhook again
//     with all books rebuilt, checked by a denial that needs them.
//
//     make k8s-bins && E2E_REQUIRED=1 go test ./test/e2e -run '^$' -bench ControllerAtScale -benchtime 1x -timeout 40m
func BenchmarkControllerAtScale(b *testing.B) {
	tenants, claims := envInt(b, "SCALE_TENANTS", 1000), envInt(b, "SCALE_CLAIMS", 10000)
	ctx := framework.Context(b, 30*time.Minute)
	installCRDs(b)
	bin, err := framework.Build(ctx, b.TempDir(), "cmd/dra-controller")
	if err != nil {
		b.Fatal(err)
	}
	ports, err := framework.FreePorts(2)
	if err != nil {
		b.Fatal(err)
	}
	metricsAddr, pprofAddr := fmt.Sprintf("127.0.0.1:%d", ports[0]), fmt.Sprintf("127.0.0.1:%d", ports[1])
	args := []string{"--metrics-addr", metricsAddr, "--metrics-secure=false", "--pprof-addr", pprofAddr}
	ctrl, err := cp.StartController(ctx, bin, args...)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = ctrl.Stop() })

	class := uniqueName("scale-gpu")
	createObject(b, profile(class, gpuaas.ProfileSelector{Type: gpuaas.DeviceTypeGPU}))
	waitForProfile(b, class, "rendered", func(p *gpuaas.GpuProfile) bool { return p.Status.DeviceClassName != "" })
	nss := scaleTenants(b, ctx, tenants)
	// One tenant outside any cohort is filled exactly, for the denial that
	// shows a restarted controller has rebuilt its books.
	full := cp.CreateNamespace(b, "scale-full")
	createObject(b, quotaFor(uniqueName("full"), []string{full}, gpuaas.QuotaLimits{GpuUnits: units("2")}))
	err = wait.PollUntilContextTimeout(ctx, time.Second, 10*time.Minute, true, func(ctx context.Context) (bool, error) {
		return countEnforced(b, ctx) == tenants+1, nil
	})
	if err != nil {
		b.Fatalf("the controller did not enforce all %d quotas: %v", tenants+1, err)
	}

	fast := fastClient(b)
	begin := time.Now()
	profiled := profileController(b, pprofAddr, "setup", 5*time.Second)
	createClaimsFast(b, ctx, fast, nss, class, claims, 16)
	<-profiled
	for i := range 2 {
		if err := createClaim(ctx, gpuClaim(full, fmt.Sprintf("held-%d", i), class, 1)); err != nil {
			b.Fatal(err)
		}
	}
	setupRate := float64(claims) / time.Since(begin).Seconds()

	b.ResetTimer()
	b.ReportMetric(setupRate, "setup-claims/s")
	before := webhookLatency(b, metricsAddr)
	lat := createPaced(b, ctx, fast, nss, class, envInt(b, "SCALE_RATE", 200), 5*time.Second)
	after := webhookLatency(b, metricsAddr)
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "create-p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "create-p99-ms")
	under5, total := after.under5-before.under5, after.count-before.count
	b.ReportMetric(under5/total, "webhook-under-5ms")
	b.ReportMetric(after.sum-before.sum, "webhook-sum-s")
	b.ReportMetric(total, "webhook-calls")
	rss, peak := processMemory(b, ctrl.Pid())
	b.ReportMetric(rss, "rss-MiB")
	b.ReportMetric(peak, "peak-rss-MiB")

	// Restart: time until the webhook answers again, then a claim that
	// only the rebuilt books can refuse.
	if err := ctrl.Stop(); err != nil {
		b.Fatal(err)
	}
	restart := time.Now()
	if ctrl, err = cp.StartController(ctx, bin, args...); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(time.Since(restart).Seconds(), "restart-to-webhook-s")
	if err := createClaim(ctx, gpuClaim(full, "over", class, 1)); err == nil {
		b.Error("a claim over a full tenant's quota was admitted right after the restart: the books were not rebuilt")
	}
	b.ReportMetric(time.Since(restart).Seconds(), "restart-to-correct-denial-s")
}

// scaleTenants creates n namespaces, each with its TenantQuota, in two
// cohorts, room for every claim the benchmark makes.
func scaleTenants(b *testing.B, ctx context.Context, n int) []string {
	prefix := uniqueName("t")
	nss := make([]string, n)
	parallel(b, n, 16, func(i int) error {
		nss[i] = fmt.Sprintf("%s-%d", prefix, i)
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: nss[i]}}
		if _, err := cp.Client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
			return err
		}
		q := quotaFor(nss[i], []string{nss[i]}, gpuaas.QuotaLimits{GpuUnits: units("1000")})
		q.Spec.Cohort = fmt.Sprintf("%s-cohort-%d", prefix, i%2)
		return ctrlClient.Create(ctx, q)
	})
	return nss
}

// countEnforced counts the quotas whose namespaces the controller resolved.
func countEnforced(b *testing.B, ctx context.Context) int {
	var list gpuaas.TenantQuotaList
	if err := ctrlClient.List(ctx, &list); err != nil {
		b.Fatal(err)
	}
	n := 0
	for _, q := range list.Items {
		if len(q.Status.Namespaces) > 0 {
			n++
		}
	}
	return n
}

// createClaimsFast creates n one-GPU claims spread over the namespaces.
func createClaimsFast(b *testing.B, ctx context.Context, c kubernetes.Interface, nss []string, class string, n, workers int) {
	parallel(b, n, workers, func(i int) error {
		return createClaimWith(ctx, c, gpuClaim(nss[i%len(nss)], fmt.Sprintf("bulk-%d", i), class, 1))
	})
}

// parallel runs f(0..n-1) on workers goroutines; the first error fails b.
func parallel(b *testing.B, n, workers int, f func(i int) error) {
	var mu sync.Mutex
	next, failed := 0, error(nil)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				mu.Lock()
				i := next
				next++
				stop := i >= n || failed != nil
				mu.Unlock()
				if stop {
					return
				}
				if err := f(i); err != nil {
					mu.Lock()
					failed = fmt.Errorf("item %d: %w", i, err)
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	if failed != nil {
		b.Fatal(failed)
	}
}

// createPaced creates claims at rate per second for d, each on its own
// goroutine (an open loop, as independent users create them), and returns
// their latencies.
func createPaced(b *testing.B, ctx context.Context, c kubernetes.Interface, nss []string, class string, rate int, d time.Duration) []time.Duration {
	n := int(d.Seconds()) * rate
	lat := make([]time.Duration, n)
	errs := make([]error, n)
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	var wg sync.WaitGroup
	for i := range n {
		<-tick.C
		wg.Go(func() {
			t0 := time.Now()
			errs[i] = createClaimWith(ctx, c, gpuClaim(nss[(i*7)%len(nss)], fmt.Sprintf("paced-%d", i), class, 1))
			lat[i] = time.Since(t0)
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			b.Fatalf("paced claim %d: %v", i, err)
		}
	}
	return lat
}

// profileController saves, when SCALE_PROFILE_DIR is set, the
// controller's goroutines and a 10 s CPU profile taken after delay, as
// <phase>-goroutines.txt and <phase>-cpu.pprof; the channel closes when
// done.
func profileController(b *testing.B, addr, phase string, delay time.Duration) <-chan struct{} {
	done := make(chan struct{})
	dir := os.Getenv("SCALE_PROFILE_DIR")
	if dir == "" {
		close(done)
		return done
	}
	go func() {
		defer close(done)
		time.Sleep(delay)
		for file, path := range map[string]string{
			phase + "-goroutines.txt": "/debug/pprof/goroutine?debug=1",
			phase + "-cpu.pprof":      "/debug/pprof/profile?seconds=10",
		} {
			resp, err := http.Get("http://" + addr + path) //nolint:noctx // a local scrape
			if err != nil {
				b.Errorf("profiling the controller: %v", err)
				return
			}
			data, err := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			if err == nil {
				err = os.WriteFile(filepath.Join(dir, file), data, 0o644)
			}
			if err != nil {
				b.Errorf("saving %s: %v", file, err)
			}
		}
	}()
	return done
}

// histogram is the claim webhook's latency histogram: calls, calls under
// 5 ms, and the sum of their latencies.
type histogram struct{ count, under5, sum float64 }

// webhookLatency scrapes controller-runtime's webhook latency histogram of
// the claim webhook from the controller's /metrics.
func webhookLatency(b *testing.B, addr string) histogram {
	b.Helper()
	resp, err := http.Get("http://" + addr + "/metrics") //nolint:noctx // a local scrape
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	h, err := parseWebhookHistogram(resp.Body, "/validate-resourceclaim")
	if err != nil {
		b.Fatal(err)
	}
	return h
}

func parseWebhookHistogram(r io.Reader, path string) (histogram, error) {
	var h histogram
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	const name = "controller_runtime_webhook_latency_seconds"
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) || !strings.Contains(line, `webhook="`+path+`"`) {
			continue
		}
		fields := strings.Fields(line)
		v, err := strconv.ParseFloat(fields[len(fields)-1], 64)
		if err != nil {
			return h, fmt.Errorf("metric line %q: %w", line, err)
		}
		switch {
		case strings.HasPrefix(line, name+"_bucket") && strings.Contains(line, `le="0.005"`):
			h.under5 = v
		case strings.HasPrefix(line, name+"_count"):
			h.count = v
		case strings.HasPrefix(line, name+"_sum"):
			h.sum = v
		}
	}
	if h.count == 0 {
		return h, fmt.Errorf("no %s for %s in the controller's metrics", name, path)
	}
	return h, sc.Err()
}

// processMemory reads a process's resident set and its peak, in MiB.
func processMemory(b *testing.B, pid int) (rss, peak float64) {
	b.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		k, v, _ := strings.Cut(line, ":")
		kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
		if err != nil {
			continue
		}
		switch k {
		case "VmRSS":
			rss = kb / 1024
		case "VmHWM":
			peak = kb / 1024
		}
	}
	return rss, peak
}

// fastClient is an API client whose own rate limit (the suite's client
// allows 100 QPS) does not hold back 200 creates/s.
func fastClient(b *testing.B) kubernetes.Interface {
	b.Helper()
	cfg := rest.CopyConfig(cp.Config)
	cfg.QPS, cfg.Burst = 2000, 4000
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		b.Fatal(err)
	}
	return c
}

func createClaimWith(ctx context.Context, c kubernetes.Interface, claim *resourceapi.ResourceClaim) error {
	_, err := c.ResourceV1().ResourceClaims(claim.Namespace).Create(ctx, claim, metav1.CreateOptions{})
	return err
}
