package e2e

import (
	"fmt"
	"slices"
	"testing"
	"time"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

// BenchmarkWaitingPodStartsAfterQuotaFrees measures how long a pod whose
// claim the quota denied takes to run once quota frees (issue 14 item 4):
// a tenant of one GPU unit runs a holder pod; a waiter pod's claim is
// denied (QuotaExceeded); the timer runs from the holder's deletion until
// the waiter runs. In between: the holder's claim is unprepared and
// deallocated, the controller sees the quota free and nudges the waiting
// pod, the kube-controller-manager creates its claim again, the webhook
// admits it, the scheduler allocates it and the node prepares it.
//
//	make k8s-bins && E2E_REQUIRED=1 go test ./test/e2e -run '^$' -bench WaitingPod -benchtime 5x
func BenchmarkWaitingPodStartsAfterQuotaFrees(b *testing.B) {
	startBenchNodes(b, 1, "quota-wait", "")
	startController(b)
	class := uniqueName("wait-gpu")
	createObject(b, profile(class, gpuaas.ProfileSelector{Type: gpuaas.DeviceTypeGPU}))
	waitForProfile(b, class, "rendered", func(p *gpuaas.GpuProfile) bool { return p.Status.DeviceClassName != "" })
	ns := cp.CreateNamespace(b, "quota-wait")
	tenant := uniqueName("quota-wait")
	createObject(b, quotaFor(tenant, []string{ns}, gpuaas.QuotaLimits{GpuUnits: units("1")}))
	waitForQuota(b, tenant, "enforced", func(q *gpuaas.TenantQuota) bool { return len(q.Status.Namespaces) == 1 })

	var waits []time.Duration
	holder := startHolder(b, ns, class, 0)
	for i := 1; b.Loop(); i++ {
		waits = append(waits, waitAfterFreeing(b, ns, class, holder, i))
		holder = fmt.Sprintf("pod-%d", i) // the waiter holds the GPU now
	}
	slices.Sort(waits)
	b.ReportMetric(waits[len(waits)/2].Seconds(), "p50-s")
	b.ReportMetric(waits[len(waits)-1].Seconds(), "max-s")
}

// startHolder starts pod-i, which takes the tenant's one GPU unit.
func startHolder(b *testing.B, ns, class string, i int) string {
	ctx := framework.Context(b, 2*time.Minute)
	name := fmt.Sprintf("pod-%d", i)
	createTemplatePod(b, ctx, templateFor(name, ns, class))
	if _, err := cp.WaitForPodRunning(ctx, ns, name); err != nil {
		b.Fatal(err)
	}
	return name
}

// waitAfterFreeing creates pod-i, waits until its claim is denied, deletes
// the holder and returns the time until pod-i runs.
func waitAfterFreeing(b *testing.B, ns, class, holder string, i int) time.Duration {
	ctx := framework.Context(b, 3*time.Minute)
	b.StopTimer()
	waiter := fmt.Sprintf("pod-%d", i)
	createTemplatePod(b, ctx, templateFor(waiter, ns, class))
	if _, err := cp.WaitForEvent(ctx, ns, "Pod", waiter, "QuotaExceeded"); err != nil {
		b.Fatalf("the waiter's claim was not denied: %v", err)
	}
	b.StartTimer()
	start := time.Now()
	deletePod(b, ctx, ns, holder)
	if _, err := cp.WaitForPodRunning(ctx, ns, waiter); err != nil {
		b.Fatal(err)
	}
	return time.Since(start)
}
