package scale

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	crclient "sigs.k8s.io/controller-runtime/pkg/client"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/health"
	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
	"github.com/gpuaas/gpu-dra-driver/test/fleet"
)

// churnClass is the catalog's whole-GPU class (demo/specs/00-catalog).
const churnClass = "gpu.gpuaas.io"

// BenchmarkControllerWhileSlicesChurn (issue 52): the dra-controller
// binary, run as the chart runs it (one replica), on the real control
// plane with FLEET_NODES kwok nodes of ours (default "1000,5000"; 8 whole
// H100s each, published by test/fleet with the plugin's slice code) and
// FLEET_OTHER_SLICES slices of another driver (default 5,000, 32 devices
// each), while slices churn at FLEET_CHURN updates per second (default 20:
// half health taints that our nodes' publishers set and clear on a GPU, as
// the plugin does on a fault, half updates of the other driver's slices).
// FLEET_TENANTS tenants (default 4, in 2 cohorts) hold FLEET_CLAIMS claims
// each (default 25) and send FLEET_DRY_RUNS server-side dry-run claim
// creates each (default 100), one after another, all tenants at once:
// each create goes through the API server and the controller's claim
// webhook. Reported per size: admission p50/p99 as the client sees it,
// and the controller's RSS (now and peak, from /proc) and heap (its
// go_memstats_heap_inuse_bytes) after the run.
//
// FLEET_PPROF_DIR=<dir> writes the controller's heap profile (after a GC)
// there after the dry runs, one per size and build, and logs its top.
//
// FLEET_BASELINE=<git ref> also runs the controller built from that ref
// (git archive, go build) on the same fleet in the same run, first;
// FLEET_BASELINE_BIN=<path> runs a binary built beforehand instead.
//
//	make bench-controller-fleet
//	(= E2E_REQUIRED=1 go test ./test/e2e/scale -run '^$' -bench ControllerWhileSlicesChurn -benchtime 1x -timeout 3h -v)
func BenchmarkControllerWhileSlicesChurn(b *testing.B) {
	ctx := framework.Context(b, 3*time.Hour)
	type build struct{ name, bin string }
	var builds []build
	if bin := os.Getenv("FLEET_BASELINE_BIN"); bin != "" {
		builds = append(builds, build{"before", bin})
	} else if ref := os.Getenv("FLEET_BASELINE"); ref != "" {
		builds = append(builds, build{"before", buildControllerAt(b, ctx, ref)})
	}
	builds = append(builds, build{"after", buildController(b, ctx)})
	others := createOtherSlices(b, ctx, "churn-other", envInt(b, "FLEET_OTHER_SLICES", 5000), 32)
	tenants := envInt(b, "FLEET_TENANTS", 4)
	for _, n := range envInts(b, "FLEET_NODES", []int{1000, 5000}) {
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			f := startFleet(b, fleet.Options{Client: scaleClient(), Nodes: n, Prefix: fmt.Sprintf("churn%d", n), Config: decodeConfig(b, wholeConfig)}) //nolint:contextcheck // the test helpers clean up after the test, past its context
			b.Cleanup(func() {                                                                                                                          //nolint:contextcheck // the test helpers clean up after the test, past its context
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
				defer cancel()
				_ = f.Delete(ctx)
			})
			for _, bl := range builds {
				b.Run(bl.name, func(b *testing.B) {
					var res churnResult
					for b.Loop() {
						res = runChurn(b, ctx, bl.bin, f, others, tenants, fmt.Sprintf("nodes-%d-%s", n, bl.name))
					}
					b.ReportMetric(res.p50.Seconds()*1000, "p50-ms")
					b.ReportMetric(res.p99.Seconds()*1000, "p99-ms")
					b.ReportMetric(res.rss, "rss-MB")
					b.ReportMetric(res.peak, "peak-rss-MB")
					b.ReportMetric(res.heap, "heap-MB")
					b.ReportMetric(res.exemptP99.Seconds()*1000, "no-webhook-p99-ms")
					b.ReportMetric(res.webhook.controllerMeanMs(), "webhook-mean-ms")
					b.Logf("%s, %d nodes (%d slices of ours), %d slices of %s, %d tenants: %d dry runs while %d slice updates: p50 %v, p99 %v; RSS %.1f MB (peak %.1f), heap %.1f MB; cached slices by driver %v",
						bl.name, n, f.Slices(), len(others), otherDriver, tenants, res.admissions, res.updates, res.p50, res.p99, res.rss, res.peak, res.heap, res.cached)
					b.Logf("%s: the same creates where no webhook is called: p50 %v, p99 %v; the claim webhook: %s",
						bl.name, res.exemptP50, res.exemptP99, res.webhook)
				})
			}
		})
	}
}

type churnResult struct {
	admissions, updates int
	p50, p99            time.Duration
	// exemptP50 and exemptP99: the same creates in a namespace the
	// webhooks skip, at the same time (the API server without them).
	exemptP50, exemptP99 time.Duration
	webhook              webhookLatency
	rss, peak, heap      float64
	cached               map[string]float64
}

// runChurn starts the controller, makes the tenants, measures their dry
// runs while slices churn, and stops the controller. Beside the tenants, a
// namespace the webhooks do not cover (gpuaas.io/quota-exempt) sends the
// same dry runs at the same time: what the API server alone takes under
// that load. The controller's and the API server's histograms of the claim
// webhook, read before and after, give the webhook's own part.
func runChurn(b *testing.B, ctx context.Context, bin string, f *fleet.Fleet, others []string, tenants int, profile string) churnResult {
	ctrl := startChartController(b, ctx, bin)
	defer func() { _ = ctrl.proc.Stop() }()
	nss := churnTenants(b, ctx, tenants, envInt(b, "FLEET_CLAIMS", 25))
	exempt := exemptNamespace(b, ctx)
	webhookBefore := claimWebhookLatency(b, ctx, ctrl)
	stop := make(chan struct{})
	var churned sync.WaitGroup
	var updates int
	churned.Go(func() { updates = churn(b, ctx, f, others, envInt(b, "FLEET_CHURN", 20), stop) })
	senders := append(slices.Clone(nss), exempt)
	lat := make([][]time.Duration, len(senders))
	var g sync.WaitGroup
	dryRuns := envInt(b, "FLEET_DRY_RUNS", 100)
	for t, ns := range senders {
		g.Go(func() { lat[t] = dryRunCreates(b, ctx, ns, dryRuns) })
	}
	g.Wait()
	close(stop)
	churned.Wait()
	webhook := claimWebhookLatency(b, ctx, ctrl).since(webhookBefore)
	all := slices.Concat(lat[:len(nss)]...)
	slices.Sort(all)
	alone := lat[len(nss)]
	slices.Sort(alone)
	res := churnResult{
		admissions: len(all), updates: updates, p50: percentile(all, 0.50), p99: percentile(all, 0.99),
		exemptP50: percentile(alone, 0.50), exemptP99: percentile(alone, 0.99), webhook: webhook,
	}
	res.rss, res.peak = ctrl.rss(b)
	if heap, err := ctrl.metrics(ctx, "go_memstats_heap_inuse_bytes", ""); err == nil {
		res.heap = heap[""] / (1 << 20)
	}
	res.cached, _ = ctrl.metrics(ctx, cachedSlicesMetric, "driver")
	ctrl.heapProfile(b, ctx, profile)
	for _, ns := range senders {
		if err := cp.DeleteNamespace(ctx, ns); err != nil {
			b.Fatal(err)
		}
	}
	return res
}

// dryRunCreates sends n server-side dry-run claim creates to ns, one after
// another, and returns how long each took as the client saw it.
func dryRunCreates(b *testing.B, ctx context.Context, ns string, n int) []time.Duration {
	var lat []time.Duration
	for i := range n {
		c := churnClaim(ns, fmt.Sprintf("dry-%d", i))
		start := time.Now()
		_, err := cp.Client.ResourceV1().ResourceClaims(ns).Create(ctx, c, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		lat = append(lat, time.Since(start))
		if err != nil {
			b.Errorf("namespace %s: dry run of claim %s: %v", ns, c.Name, err)
			return lat
		}
	}
	return lat
}

// exemptNamespace makes a namespace the claim webhooks skip (the
// namespaceSelector leaves out gpuaas.io/quota-exempt).
func exemptNamespace(b *testing.B, ctx context.Context) string {
	ns := cp.CreateNamespace(b, "churn-exempt") //nolint:contextcheck // the test helpers clean up after the test, past its context
	patch := []byte(`{"metadata":{"labels":{"` + gpuaas.QuotaExemptLabel + `":"true"}}}`)
	_, err := cp.Client.CoreV1().Namespaces().Patch(ctx, ns, types.MergePatchType, patch, metav1.PatchOptions{})
	if err != nil {
		b.Fatalf("labelling %s exempt: %v", ns, err)
	}
	return ns
}

// churn updates slices at rate per second until stop: in turn a health
// fault set or cleared on the first GPU of one of our nodes (the node's
// publisher writes its slice with the GPU's devices tainted, as the
// plugin does) and a label of one of the other driver's slices. It
// returns how many updates it made.
func churn(b *testing.B, ctx context.Context, f *fleet.Fleet, others []string, rate int, stop <-chan struct{}) int {
	tick := time.NewTicker(time.Second / time.Duration(max(1, rate)))
	defer tick.Stop()
	faulty := map[int]bool{}
	nodes := len(f.Names())
	for i := 0; ; i++ {
		select {
		case <-stop:
			return i
		case <-ctx.Done():
			return i
		case <-tick.C:
		}
		if i%2 == 0 {
			node := (i / 2) % nodes
			var faults []health.Fault
			if !faulty[node] {
				if gpus := f.GPUs(node); len(gpus) > 0 {
					faults = []health.Fault{{Kind: health.KindECC, Value: "double-bit", GPU: gpus[0], Effect: resourceapi.DeviceTaintEffectNoSchedule}}
				}
			}
			faulty[node] = faults != nil
			f.SetFaults(node, faults)
			continue
		}
		name := others[(i/2)%len(others)]
		patch := fmt.Appendf(nil, `{"metadata":{"labels":{"example.com/revision":"%d"}}}`, i)
		if _, err := cp.Client.ResourceV1().ResourceSlices().Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil && ctx.Err() == nil {
			b.Errorf("updating slice %s of %s: %v", name, otherDriver, err)
		}
	}
}

// churnTenants makes n tenants, each a namespace with a TenantQuota (two
// cohorts) and claims claims admitted by the webhook, and waits until the
// controller has observed every quota.
func churnTenants(b *testing.B, ctx context.Context, n, claims int) []string {
	c := gpuaasClient(b)
	var nss []string
	for t := range n {
		ns := cp.CreateNamespace(b, fmt.Sprintf("churn-tenant-%d", t)) //nolint:contextcheck // the test helpers clean up after the test, past its context
		nss = append(nss, ns)
		q := &gpuaas.TenantQuota{ObjectMeta: metav1.ObjectMeta{Name: ns}, Spec: gpuaas.TenantQuotaSpec{
			Namespaces: []string{ns}, Cohort: fmt.Sprintf("churn-cohort-%d", t%2),
			Limits: gpuaas.QuotaLimits{GpuUnits: ptr.To(resource.MustParse("100000"))},
		}}
		if err := c.Create(ctx, q); err != nil {
			b.Fatalf("creating TenantQuota %s: %v", q.Name, err)
		}
		b.Cleanup(func() { _ = c.Delete(context.Background(), q) }) //nolint:contextcheck // the test helpers clean up after the test, past its context
	}
	err := wait.PollUntilContextTimeout(ctx, time.Second, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
		for _, ns := range nss {
			var q gpuaas.TenantQuota
			if err := c.Get(ctx, crclient.ObjectKey{Name: ns}, &q); err != nil || q.Status.ObservedGeneration < q.Generation {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		b.Fatalf("the controller did not observe the %d TenantQuotas: %v", n, err)
	}
	for _, ns := range nss {
		for i := range claims {
			if _, err := cp.Client.ResourceV1().ResourceClaims(ns).Create(ctx, churnClaim(ns, fmt.Sprintf("held-%d", i)), createOpts); err != nil {
				b.Fatalf("creating claim %d of tenant %s: %v", i, ns, err)
			}
		}
	}
	return nss
}

func churnClaim(ns, name string) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: churnClass},
		}}}},
	}
}

// gpuaasClient is a client of the control plane that knows our CRDs.
func gpuaasClient(tb testing.TB) crclient.Client {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		tb.Fatal(err)
	}
	if err := gpuaas.AddToScheme(s); err != nil {
		tb.Fatal(err)
	}
	c, err := crclient.New(cp.Config, crclient.Options{Scheme: s})
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

// buildControllerAt builds cmd/dra-controller of the tree at ref (a
// commit of this repository), for a before-and-after in one run.
func buildControllerAt(tb testing.TB, ctx context.Context, ref string) string {
	root, err := framework.RepoRoot()
	if err != nil {
		tb.Fatal(err)
	}
	src := tb.TempDir()
	archive := exec.CommandContext(ctx, "sh", "-c", `git -C "$1" archive "$2" | tar -x -C "$3"`, "sh", root, ref, src)
	if out, err := archive.CombinedOutput(); err != nil {
		tb.Fatalf("extracting %s: %v\n%s", ref, err, out)
	}
	bin := filepath.Join(tb.TempDir(), "dra-controller-"+strings.ReplaceAll(ref, "/", "-"))
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/dra-controller")
	build.Dir = src
	if out, err := build.CombinedOutput(); err != nil {
		tb.Fatalf("building the controller of %s: %v\n%s", ref, err, out)
	}
	return bin
}

// envInt is $name as a positive number, or def.
func envInt(tb testing.TB, name string, def int) int {
	if v := envInts(tb, name, nil); len(v) == 1 {
		return v[0]
	}
	return def
}
