package webhook

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	quotaadmission "github.com/gpuaas/gpu-dra-driver/pkg/controller/admission"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller/internal/testworld"
)

// fleetOtherSlices is how many slices of another driver the fleet holds
// (32 devices each, as the gpu.example.com slices).
const fleetOtherSlices = 5000

// BenchmarkAdmissionWhileSlicesChurn (issue 52): claim admission at fleet
// size while slices churn. The fleet is FLEET_NODES nodes (default 1,000;
// comma-separated for several) of 8 whole GPUs, one slice each, plus
// 5,000 slices of another driver; 20 tenants of 100 claims in 2 cohorts.
// Before every admission one node's GPU gets a health taint (or loses
// it), delivered as the slice informer would:
//
//   - before: today's cache and handler: every slice of every driver is
//     cached, and every slice event invalidates the catalog;
//   - after: the cache holds our driver's slices only (the field selector)
//     and the event goes through admission.CatalogHandler.
//
// Reported: p50/p99 of the admissions and the heap after setup (the
// objects the cache holds, with their slices), in one run.
func BenchmarkAdmissionWhileSlicesChurn(b *testing.B) {
	sizes := []int{1000}
	if v := os.Getenv("FLEET_NODES"); v != "" {
		sizes = nil
		for _, s := range strings.Split(v, ",") {
			n, err := strconv.Atoi(s)
			if err != nil {
				b.Fatalf("FLEET_NODES=%q: %v", v, err)
			}
			sizes = append(sizes, n)
		}
	}
	for _, nodes := range sizes {
		for _, mode := range []string{"before", "after"} {
			b.Run(fmt.Sprintf("nodes=%d/%s", nodes, mode), func(b *testing.B) {
				benchSliceChurn(b, nodes, mode == "after")
			})
		}
	}
}

func benchSliceChurn(b *testing.B, nodes int, after bool) {
	mem, claims, ours := fleetCluster(b, nodes, !after)
	heap := heapMB()
	acct := quotaadmission.NewAccountant(mem, mem, quotaadmission.NewLedger(benchBooks(b), "gpuaas"))
	deliver := func(_, _ *resourceapi.ResourceSlice) { acct.InvalidateCatalog() }
	if after {
		h := quotaadmission.CatalogHandler(&resourceapi.ResourceSlice{}, acct.InvalidateCatalog)
		deliver = func(o, n *resourceapi.ResourceSlice) { h.OnUpdate(o, n) }
	}
	h, _ := newClaimWebhook(b, acct)
	reqs := make([]admission.Request, 0, 64)
	for i := range 64 {
		c := ownedByPod(claim(fmt.Sprintf("tenant-%d", i%benchTenants), fmt.Sprintf("new-%d", i), "h100", 1), "pod")
		c.ResourceVersion = "1"
		reqs = append(reqs, request(b, admissionv1.Create, c.Namespace, c.Name, c))
	}
	ctx := context.Background()
	// The first admission builds the catalog and prices every claim in
	// either mode: not what a slice event costs.
	warm := reqs[0]
	warm.UID = "warm-up"
	if resp := h.Handle(ctx, warm); !resp.Allowed {
		b.Fatalf("denied: %s", resp.Result.Message)
	}
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		old := ours[i%len(ours)]
		next := toggleTaint(old, i)
		mem.Put(next)
		ours[i%len(ours)] = next
		b.StartTimer()
		start := time.Now()
		deliver(old, next)
		req := reqs[i%len(reqs)]
		req.UID = types.UID(fmt.Sprint(i))
		resp := h.Handle(ctx, req)
		lat = append(lat, time.Since(start))
		if !resp.Allowed {
			b.Fatalf("denied: %s", resp.Result.Message)
		}
		b.StopTimer()
		churn(acct, mem, claims, i, req)
		b.StartTimer()
	}
	reportLatency(b, lat, false)
	b.ReportMetric(heap, "heap-MB")
}

// fleetCluster is benchClusterOf's tenants over nodes nodes of 8 H100s;
// with others, also the other driver's slices (what a cache without the
// field selector held).
func fleetCluster(b *testing.B, nodes int, others bool) (*testworld.MemReader, [][]*resourceapi.ResourceClaim, []*resourceapi.ResourceSlice) {
	objs := world(b)[:4] // profiles h100, mig-1g and their classes
	var ours []*resourceapi.ResourceSlice
	for n := range nodes {
		devs := make([]resourceapi.Device, 0, 8)
		for i := range 8 {
			devs = append(devs, wholeGPU(i))
		}
		s := resourceSlice(fmt.Sprintf("gpu-node-%d", n), devs...)
		s.ResourceVersion = "1"
		ours = append(ours, s)
		objs = append(objs, s)
	}
	if others {
		for n := range fleetOtherSlices {
			devs := make([]resourceapi.Device, 0, 32)
			for i := range 32 {
				devs = append(devs, wholeGPU(i))
			}
			s := resourceSlice(fmt.Sprintf("other-node-%d", n), devs...)
			s.Name, s.Spec.Driver = fmt.Sprintf("other-node-%d-slice", n), "gpu.example.com"
			objs = append(objs, s)
		}
	}
	claims := make([][]*resourceapi.ResourceClaim, benchTenants)
	for t := range benchTenants {
		namespace := fmt.Sprintf("tenant-%d", t)
		objs = append(objs, ns(namespace, nil), tenantQuota(namespace, t, gpuaas.TenantQuotaSpec{
			Namespaces: []string{namespace}, Cohort: fmt.Sprintf("cohort-%d", t%2),
			Limits: gpuaas.QuotaLimits{GpuUnits: qty("100000"), GpuMemory: qty("10000Ti"), Devices: map[string]int64{"h100": 1000000}},
		}))
		for i := range benchClaimsPerTenant {
			c := claim(namespace, fmt.Sprintf("existing-%d", i), "h100", 1)
			if i%2 == 0 {
				c = allocatedTo(c, fmt.Sprintf("gpu-node-%d", i%nodes), fmt.Sprintf("gpu-%d", i%8))
			}
			c.ResourceVersion = "1"
			claims[t] = append(claims[t], c)
			objs = append(objs, c)
		}
	}
	return testworld.NewMemReader(objs...), claims, ours
}

// toggleTaint is s with its first GPU tainted, or untainted, as the
// plugin's health checks do.
func toggleTaint(s *resourceapi.ResourceSlice, i int) *resourceapi.ResourceSlice {
	out := s.DeepCopy()
	out.ResourceVersion = strconv.Itoa(i + 2)
	if len(out.Spec.Devices[0].Taints) > 0 {
		out.Spec.Devices[0].Taints = nil
	} else {
		out.Spec.Devices[0].Taints = []resourceapi.DeviceTaint{{Key: "gpu.gpuaas.io/unhealthy", Effect: resourceapi.DeviceTaintEffectNoSchedule}}
	}
	return out
}

func heapMB() float64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return float64(m.HeapAlloc) / (1 << 20)
}
