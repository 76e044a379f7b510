package admission

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller/internal/testworld"
	"github.com/gpuaas/gpu-dra-driver/pkg/quota/quotatest"
)

// BenchmarkPeerAdmissionWhileRecounting (issue 55 route 5): tenant-0 holds
// seven unallocated claims whose selectors are dear to evaluate (each
// within its own CEL budget), and the catalog changes without pause (a
// price-moving event: a node's devices), each change followed by the quota
// reconciler's status of tenant-0, which recounts its claims. A peer of
// another cohort admits claims of a shape it priced before, one after
// another, under the chart's 5 s webhook timeout. Reported: the peer's
// latency and refusals. "before" prices the recounts as the parent of the
// fix did (under the accountant-wide claims lock, no budget), "after" as
// now; one run, both.
func BenchmarkPeerAdmissionWhileRecounting(b *testing.B) {
	for _, legacy := range []bool{true, false} {
		name := map[bool]string{true: "before", false: "after"}[legacy]
		b.Run(name, func(b *testing.B) { benchPeerWhileRecounting(b, legacy) })
	}
}

func benchPeerWhileRecounting(b *testing.B, legacy bool) {
	objs := world(b)[:4] // the profiles h100 and mig-1g and their classes
	for n := range 16 {
		var devs []resourceapi.Device
		for i := range 8 {
			devs = append(devs, testworld.WholeGPU(i))
		}
		objs = append(objs, resourceSlice(fmt.Sprintf("gpu-node-%d", n), devs...))
	}
	for t := range 2 {
		namespace := fmt.Sprintf("tenant-%d", t)
		objs = append(objs, ns(namespace, nil), tenantQuota(namespace, t, gpuaas.TenantQuotaSpec{
			Namespaces: []string{namespace}, Cohort: namespace,
			Limits: gpuaas.QuotaLimits{GpuUnits: qty("1000")}}))
	}
	for i := range 7 {
		c := claim("tenant-0", fmt.Sprint("dear-", i), "h100", 1)
		var sel []resourceapi.DeviceSelector
		for s := range 6 {
			sel = append(sel, resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{Expression: quotatest.DearSelector(fmt.Sprint(i, "-", s))}})
		}
		c.Spec.Devices.Requests[0].Exactly.Selectors = sel
		c.ResourceVersion = "1"
		objs = append(objs, c)
	}
	for i := range 20 {
		c := claim("tenant-1", fmt.Sprint("held-", i), "h100", 1)
		c.ResourceVersion = "1"
		objs = append(objs, c)
	}
	mem := testworld.NewMemReader(objs...)
	acct := NewAccountant(mem, mem, NewLedger(newFakeClient(b), "gpuaas"))
	acct.legacyRecount = legacy
	ctx, stop := context.WithCancel(context.Background())
	if _, err := acct.Report(ctx, "tenant-0"); err != nil { // compiled once, as when admitted
		b.Fatal(err)
	}
	var attack sync.WaitGroup
	attack.Go(func() {
		for ctx.Err() == nil {
			acct.InvalidateCatalog()
			rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			_, _ = acct.Report(rctx, "tenant-0")
			cancel()
		}
	})
	time.Sleep(time.Second) // the attack is under way
	lat := make([]time.Duration, 0, b.N)
	refused := 0
	for i := 0; b.Loop(); i++ {
		rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second) // the chart's webhook timeout
		start := time.Now()
		adm, err := acct.Admit(rctx, claim("tenant-1", fmt.Sprint("peer-", i), "h100", 1), true)
		lat = append(lat, time.Since(start))
		cancel()
		if err != nil || !adm.Allowed {
			refused++
		}
	}
	stop()
	attack.Wait()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2])/1e6, "p50-ms")
	b.ReportMetric(float64(lat[(len(lat)*99)/100])/1e6, "p99-ms")
	b.ReportMetric(float64(lat[len(lat)-1])/1e6, "max-ms")
	b.ReportMetric(float64(refused), "refused")
}

var _ client.Reader = (*testworld.MemReader)(nil)
