package scale

import (
	"fmt"
	"sync"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

// steadyLoad is pods created at a fixed rate for a while, each deleted a
// lifetime after it is bound: a cluster in steady churn, on dynamic MIG.
type steadyLoad struct {
	rate               float64 // pods per second
	duration, lifetime time.Duration
}

func (r *runner) steady(tb testing.TB, load steadyLoad) result {
	publish := r.configure(tb, dynamicConfig)
	ctx := framework.Context(tb, 30*time.Minute)
	ns := cp.CreateNamespace(tb, "scale-steady")
	r.createTemplates(tb, ns, "claim", mode{claims: []resourceapi.DeviceRequest{exactly("mig-1g.10gb.gpuaas.io")}}.templates())
	rec := watchBinds(tb, r.client, ns, "claim")
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { r.deleteAfter(tb, ns, rec, load.lifetime, stop) })
	created := map[string]time.Time{}
	tick := time.NewTicker(time.Duration(float64(time.Second) / load.rate))
	start := time.Now()
	for i := 0; time.Since(start) < load.duration; i++ {
		<-tick.C
		name := fmt.Sprintf("claim-%d", i)
		created[name] = time.Now()
		if _, err := r.client.CoreV1().Pods(ns).Create(ctx, podFor(ns, name, "claim", i, 1), createOpts); err != nil {
			tb.Fatalf("creating pod %s: %v", name, err)
		}
	}
	tick.Stop()
	rec.waitAll(tb, len(created))
	close(stop)
	wg.Wait()
	res := result{mode: "steady-state-dynamic-mig-1g", pods: len(created), slices: r.fleet.Slices(), publish: publish,
		podsPerSec: float64(len(created)) / load.duration.Seconds()}
	res.p50, res.p99 = rec.latencies(created)
	if err := cp.DeleteNamespace(ctx, ns); err != nil {
		tb.Fatal(err)
	}
	waitNoClaims(tb, r.client, ns)
	return res
}

// deleteAfter deletes each pod a lifetime after it was bound, until stop.
func (r *runner) deleteAfter(tb testing.TB, ns string, rec *bindRecorder, lifetime time.Duration, stop <-chan struct{}) {
	ctx := framework.Context(tb, 30*time.Minute)
	deleted := map[string]bool{}
	zero := int64(0)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		for _, name := range rec.boundBefore(time.Now().Add(-lifetime)) {
			if deleted[name] {
				continue
			}
			deleted[name] = true
			if err := r.client.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
				tb.Errorf("deleting pod %s: %v", name, err)
			}
		}
	}
}

// boundBefore are the pods bound before t.
func (r *bindRecorder) boundBefore(t time.Time) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for name, at := range r.bound {
		if at.Before(t) {
			out = append(out, name)
		}
	}
	return out
}
