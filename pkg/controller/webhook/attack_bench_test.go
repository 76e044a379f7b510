package webhook

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	quotaadmission "github.com/gpuaas/gpu-dra-driver/pkg/controller/admission"
	"github.com/gpuaas/gpu-dra-driver/pkg/quota/quotatest"
)

// The admission path under a tenant's attack (issue 36): claims of the
// largest selectors the API server lets through, each distinct, so that no
// cache helps. Measured, not asserted: see BENCHMARKS.md.

// maximalClaim is a claim near the API server's 3 MiB request limit: 32
// requests of 8 distinct selectors of 10 KiB (the limit of one
// expression), each evaluated against every device.
func maximalClaim(namespace, name string, salt int) *resourceapi.ResourceClaim {
	c := claim(namespace, name, "h100", 1)
	c.Spec.Devices.Requests = nil
	for r := range 32 {
		var sel []resourceapi.DeviceSelector
		for s := range 8 {
			sel = append(sel, resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{
				Expression: quotatest.DearSelector(fmt.Sprintf("%d-%d-%d", salt, r, s))}})
		}
		c.Spec.Devices.Requests = append(c.Spec.Devices.Requests, resourceapi.DeviceRequest{
			Name: fmt.Sprintf("r%d", r), Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "h100",
				AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1, Selectors: sel}})
	}
	return c
}

// heapInUse is the heap after a collection, in MiB.
func heapInUse() float64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return float64(m.HeapInuse) / (1 << 20)
}

// procStatusMiB reads a memory line of /proc/self/status (VmRSS: what the
// process holds in RAM now, VmHWM: its peak), in MiB: what a container's
// memory limit counts, heap, stacks, the runtime's own and freed pages the
// runtime has not returned alike.
func procStatusMiB(b *testing.B, field string) float64 {
	b.Helper()
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		b.Fatal(err)
	}
	for line := range strings.Lines(string(data)) {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
			if err != nil {
				b.Fatal(err)
			}
			return kb / 1024
		}
	}
	b.Fatalf("no %s in /proc/self/status", field)
	return 0
}

// BenchmarkMaximalDryRuns: dry runs of maximal claims, each with new
// selectors, through the webhook. Reported: the heap after them (what the
// controller keeps of them: compiled selectors within their bound, no
// prices) and the latency of each.
func BenchmarkMaximalDryRuns(b *testing.B) {
	mem, _ := benchCluster(b)
	acct := quotaadmission.NewAccountant(mem, mem, quotaadmission.NewLedger(benchBooks(b), "gpuaas"))
	h, _ := newClaimWebhook(b, acct)
	before, rssBefore := heapInUse(), procStatusMiB(b, "VmRSS")
	lat := make([]time.Duration, 0, b.N)
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		c := maximalClaim("tenant-0", fmt.Sprintf("dry-%d", i), i)
		req := request(b, admissionv1.Create, c.Namespace, c.Name, c)
		req.UID, req.DryRun = types.UID(fmt.Sprint(i)), ptr.To(true)
		b.StartTimer()
		start := time.Now()
		resp := h.Handle(context.Background(), req)
		lat = append(lat, time.Since(start))
		if resp.Allowed {
			b.Fatal("a maximal claim was priced within the CEL budget")
		}
	}
	b.ReportMetric(heapInUse()-before, "heap-growth-MiB")
	// The process's RSS, as the controller's pod would show it: the
	// benchmark binary holds the accountant, the webhook and the cluster
	// snapshot as a controller replica does, and nothing else of size.
	b.ReportMetric(rssBefore, "rss-before-MiB")
	b.ReportMetric(procStatusMiB(b, "VmRSS"), "rss-after-MiB")
	b.ReportMetric(procStatusMiB(b, "VmHWM"), "rss-peak-MiB")
	reportLatency(b, lat, false)
}

// BenchmarkPeerAdmissionUnderAttack: a tenant sends maximal claims (not dry
// runs) from two callers without pause while a peer of another cohort
// creates ordinary claims; reported is the peer's latency.
func BenchmarkPeerAdmissionUnderAttack(b *testing.B) {
	mem, claims := benchCluster(b)
	acct := quotaadmission.NewAccountant(mem, mem, quotaadmission.NewLedger(benchBooks(b), "gpuaas"))
	h, _ := newClaimWebhook(b, acct)
	ctx, stop := context.WithCancel(context.Background())
	var attackers sync.WaitGroup
	for a := range 2 {
		attackers.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				c := maximalClaim("tenant-0", fmt.Sprintf("attack-%d-%d", a, i), 1000000*(a+1)+i)
				req := request(b, admissionv1.Create, c.Namespace, c.Name, c)
				req.UID = types.UID(c.Name)
				rctx, cancel := context.WithTimeout(ctx, 10*time.Second) // the webhook's timeout
				h.Handle(rctx, req)
				cancel()
			}
		})
	}
	time.Sleep(time.Second) // the attack is under way
	lat := make([]time.Duration, 0, b.N)
	for i := 0; b.Loop(); i++ {
		c := ownedByPod(claim("tenant-1", fmt.Sprintf("peer-%d", i), "h100", 1), "pod")
		c.ResourceVersion = "1"
		req := request(b, admissionv1.Create, c.Namespace, c.Name, c)
		req.UID = types.UID(fmt.Sprint(i))
		start := time.Now()
		resp := h.Handle(context.Background(), req)
		lat = append(lat, time.Since(start))
		if !resp.Allowed {
			b.Fatalf("the peer was denied: %s", resp.Result.Message)
		}
		b.StopTimer()
		stored(acct, mem, claims, 1, claim(req.Namespace, fmt.Sprintf("%s-%d", req.Name, i), "h100", 1))
		b.StartTimer()
	}
	stop()
	attackers.Wait()
	reportLatency(b, lat, false)
	b.ReportMetric(float64(lat[len(lat)-1])/1e6, "max-ms")
}

// BenchmarkPeerAdmissionUnderDryRunAlternatives (issue 55 route 4): a
// tenant sends server-side dry runs of claims with eight firstAvailable
// alternatives of maximal selectors through the alternatives webhook, from
// two callers without pause, while a peer of another cohort creates claims
// of a new shape each (a selector of its own, so no memo helps) through the
// claim webhook under the chart's 5 s timeout; reported are the peer's
// latency and how many of its claims were refused.
func BenchmarkPeerAdmissionUnderDryRunAlternatives(b *testing.B) {
	mem, claims := benchCluster(b)
	acct := quotaadmission.NewAccountant(mem, mem, quotaadmission.NewLedger(benchBooks(b), "gpuaas"))
	h, _ := newClaimWebhook(b, acct)
	trimmer := newAlternativesWebhook(b, acct)
	ctx, stop := context.WithCancel(context.Background())
	var attackers sync.WaitGroup
	for a := range 2 {
		attackers.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				c := maximalAlternatives("tenant-0", fmt.Sprintf("dry-%d-%d", a, i), 1000000*(a+1)+i)
				req := request(b, admissionv1.Create, c.Namespace, c.Name, c)
				req.UID, req.DryRun = types.UID(c.Name), ptr.To(true)
				rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				trimmer.Handle(rctx, req)
				cancel()
			}
		})
	}
	time.Sleep(time.Second) // the attack is under way
	lat := make([]time.Duration, 0, b.N)
	refused := 0
	for i := 0; b.Loop(); i++ {
		c := ownedByPod(claim("tenant-1", fmt.Sprintf("peer-%d", i), "h100", 1), "pod")
		c.Spec.Devices.Requests[0].Exactly.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
			Expression: fmt.Sprintf(`device.driver == "gpu.gpuaas.io" && %q != ""`, fmt.Sprint("peer-", i))}}}
		c.ResourceVersion = "1"
		req := request(b, admissionv1.Create, c.Namespace, c.Name, c)
		req.UID = types.UID(fmt.Sprint(i))
		rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second) // the chart's webhook timeout
		start := time.Now()
		resp := h.Handle(rctx, req)
		lat = append(lat, time.Since(start))
		cancel()
		if !resp.Allowed {
			refused++
		}
		b.StopTimer()
		stored(acct, mem, claims, 1, claim(req.Namespace, fmt.Sprintf("%s-%d", req.Name, i), "h100", 1))
		b.StartTimer()
	}
	stop()
	attackers.Wait()
	reportLatency(b, lat, false)
	b.ReportMetric(float64(lat[len(lat)-1])/1e6, "max-ms")
	b.ReportMetric(float64(refused), "refused")
}

// maximalAlternatives is a claim of one request with eight firstAvailable
// alternatives, each of eight distinct maximal selectors.
func maximalAlternatives(namespace, name string, salt int) *resourceapi.ResourceClaim {
	c := claim(namespace, name, "h100", 1)
	r := &c.Spec.Devices.Requests[0]
	r.Exactly = nil
	for a := range 8 {
		var sel []resourceapi.DeviceSelector
		for s := range 8 {
			sel = append(sel, resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{
				Expression: quotatest.DearSelector(fmt.Sprintf("%d-%d-%d", salt, a, s))}})
		}
		r.FirstAvailable = append(r.FirstAvailable, resourceapi.DeviceSubRequest{Name: fmt.Sprintf("alt-%d", a),
			DeviceClassName: "h100", AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1, Selectors: sel})
	}
	return c
}

// Issue 36: a claim whose selectors cost more than MaxCELCostPerClaim to
// price was charged a guess and admitted; it is refused as unpriced, and
// says why.
func TestClaimWebhookRefusesClaimsOverTheCELBudget(t *testing.T) {
	acct, _ := newAccountant(t, append(world(t), ns("a", nil), teamQuota("team-a", "a", "100"))...)
	h, _ := newClaimWebhook(t, acct)
	c := claim("a", "heavy", "h100", 1)
	c.Spec.Devices.Requests = nil
	for r := range 12 {
		c.Spec.Devices.Requests = append(c.Spec.Devices.Requests, resourceapi.DeviceRequest{
			Name: fmt.Sprintf("r%d", r), Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "h100", Count: 1,
				AllocationMode: resourceapi.DeviceAllocationModeExactCount,
				Selectors:      []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: quotatest.DearSelector(fmt.Sprint("budget-", r))}}}}})
	}
	resp := h.Handle(ctx(t), request(t, admissionv1.Create, "a", c.Name, c))
	if resp.Allowed || !strings.Contains(resp.Result.Message, "cost more to evaluate against the published devices than one claim may") {
		t.Fatalf("a claim over the CEL budget: allowed %v, %q; want refused for its cost", resp.Allowed, resp.Result.Message)
	}
}
