package e2e

import (
	"fmt"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

// BenchmarkClaimAdmission measures the time to create a one-GPU
// ResourceClaim through the real kube-apiserver and the controller's
// webhook: in a namespace no quota covers (priced, nothing to reserve),
// and in a tenant's namespace, where every admission also writes the
// tenant's book of the quota ledger (a ConfigMap update). Sequential
// creates give the latency; 8 concurrent creators the throughput, which
// the ledger serializes per book.
//
//	make k8s-bins && E2E_REQUIRED=1 go test ./test/e2e -run '^$' -bench ClaimAdmission -benchtime 200x
func BenchmarkClaimAdmission(b *testing.B) {
	startController(b)
	installCRDs(b)
	class := uniqueName("bench-gpu")
	createObject(b, profile(class, gpuaas.ProfileSelector{Type: gpuaas.DeviceTypeGPU}))
	waitForProfile(b, class, "rendered", func(p *gpuaas.GpuProfile) bool { return p.Status.DeviceClassName != "" })
	free := cp.CreateNamespace(b, "bench-free")
	tenant := cp.CreateNamespace(b, "bench-tenant")
	name := uniqueName("bench")
	createObject(b, quotaFor(name, []string{tenant}, gpuaas.QuotaLimits{GpuUnits: units("1000000")}))
	waitForQuota(b, name, "enforced", func(q *gpuaas.TenantQuota) bool { return len(q.Status.Namespaces) == 1 })

	for _, c := range []struct{ name, ns string }{{"no-quota", free}, {"tenant-ledger", tenant}} {
		for _, workers := range []int{1, 8} {
			b.Run(fmt.Sprintf("%s/workers-%d", c.name, workers), func(b *testing.B) {
				admitClaims(b, c.ns, class, workers)
			})
		}
	}
}

// admitClaims creates b.N claims with workers creators and reports the
// latency percentiles and the throughput.
func admitClaims(b *testing.B, ns, class string, workers int) {
	ctx := framework.Context(b, 10*time.Minute)
	prefix := uniqueName("c")
	latencies := make([]time.Duration, b.N)
	b.ResetTimer()
	start := time.Now()
	parallel(b, b.N, workers, func(n int) error {
		t0 := time.Now()
		if err := createClaim(ctx, gpuClaim(ns, fmt.Sprintf("%s-%d", prefix, n), class, 1)); err != nil {
			return err
		}
		latencies[n] = time.Since(t0)
		return nil
	})
	elapsed := time.Since(start)
	b.StopTimer()
	slices.Sort(latencies)
	b.ReportMetric(float64(latencies[len(latencies)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(latencies[len(latencies)*99/100].Microseconds())/1000, "p99-ms")
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "claims/s")
	if err := cp.Client.ResourceV1().ResourceClaims(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		b.Fatal(err)
	}
}
