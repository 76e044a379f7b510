package webhook

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	quotaadmission "github.com/gpuaas/gpu-dra-driver/pkg/controller/admission"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller/internal/testworld"
)

// benchCluster: 16 nodes of 8 whole H100s, 2 nodes of 8 GPUs cut into 7 1g
// slices each (240 devices), 4 profiles, 20 tenants in 2 cohorts with 100
// claims each (half allocated).
const (
	benchTenants         = 20
	benchClaimsPerTenant = 100
)

func benchCluster(b *testing.B) (*testworld.MemReader, [][]*resourceapi.ResourceClaim) {
	return benchClusterOf(b, benchTenants, benchClaimsPerTenant)
}

// benchClusterOf is benchCluster with tenants tenants of perTenant claims.
func benchClusterOf(b *testing.B, tenants, perTenant int) (*testworld.MemReader, [][]*resourceapi.ResourceClaim) {
	objs := world(b)[:4] // profiles h100, mig-1g and their classes
	for n := range 16 {
		var devs []resourceapi.Device
		for i := range 8 {
			devs = append(devs, wholeGPU(i))
		}
		objs = append(objs, resourceSlice(fmt.Sprintf("gpu-node-%d", n), devs...))
	}
	for n := range 2 {
		var devs []resourceapi.Device
		for i := range 56 {
			d := mig1g(i)
			d.Name = fmt.Sprintf("gpu-%d-mig-1g-%d", i/7, i%7)
			devs = append(devs, d)
		}
		objs = append(objs, resourceSlice(fmt.Sprintf("mig-node-%d", n), devs...))
	}
	for _, name := range []string{"mig-3g", "shared"} {
		p := gpuProfile(name, gpuaas.ProfileSelector{MigProfile: "3g.40gb"})
		objs = append(objs, p, classOf(b, p))
	}
	claims := make([][]*resourceapi.ResourceClaim, tenants)
	for t := range tenants {
		namespace := fmt.Sprintf("tenant-%d", t)
		objs = append(objs, ns(namespace, nil), tenantQuota(namespace, t, gpuaas.TenantQuotaSpec{
			Namespaces: []string{namespace}, Cohort: fmt.Sprintf("cohort-%d", t%2),
			Limits: gpuaas.QuotaLimits{GpuUnits: qty("1000"), GpuMemory: qty("100Ti"), Devices: map[string]int64{"h100": 10000}},
		}))
		for i := range perTenant {
			c := claim(namespace, fmt.Sprintf("existing-%d", i), "h100", 1)
			if i%2 == 0 {
				c = allocatedTo(c, fmt.Sprintf("gpu-node-%d", i%16), fmt.Sprintf("gpu-%d", i%8))
			}
			c.ResourceVersion = "1"
			claims[t] = append(claims[t], c)
			objs = append(objs, c)
		}
	}
	return testworld.NewMemReader(objs...), claims
}

// BenchmarkClaimAdmission measures the quota webhook's admission path for
// one ResourceClaim CREATE: decoding the AdmissionReview request, pricing
// the claim, summing the tenant's and its cohort's usage, deciding, and
// reserving. After each admission the claim "shows up in the cache" and the
// tenant's oldest claim goes, so every tenant stays at 100 claims.
// Reported: claims/s of one serial caller and the p50/p99 latency.
func BenchmarkClaimAdmission(b *testing.B) {
	mem, claims := benchCluster(b)
	acct := quotaadmission.NewAccountant(mem, mem, quotaadmission.NewLedger(benchBooks(b), "gpuaas"))
	h, _ := newClaimWebhook(b, acct)
	reqs := make([]admission.Request, 0, 64)
	for i := range 64 {
		t := i % benchTenants
		class := []string{"h100", "mig-1g"}[i%2]
		c := ownedByPod(claim(fmt.Sprintf("tenant-%d", t), fmt.Sprintf("new-%d", i), class, 1), "pod")
		c.ResourceVersion = "1"
		reqs = append(reqs, request(b, admissionv1.Create, c.Namespace, c.Name, c))
	}
	ctx := context.Background()
	lat := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		req := reqs[i%len(reqs)]
		req.UID = types.UID(fmt.Sprint(i))
		start := time.Now()
		resp := h.Handle(ctx, req)
		lat = append(lat, time.Since(start))
		if !resp.Allowed {
			b.Fatalf("denied: %s", resp.Result.Message)
		}
		b.StopTimer()
		churn(acct, mem, claims, i, req)
		b.StartTimer()
	}
	reportLatency(b, lat, true)
}

// churn makes the admitted claim visible in the "cache" and drops the
// tenant's oldest, as the informer would.
func churn(acct *quotaadmission.Accountant, mem *testworld.MemReader, claims [][]*resourceapi.ResourceClaim, i int, req admission.Request) {
	stored(acct, mem, claims, i, claim(req.Namespace, fmt.Sprintf("%s-%d", req.Name, i), "h100", 1))
}

// stored makes c visible in the "cache" as claim number i and drops its
// tenant's oldest, as the informer would.
func stored(acct *quotaadmission.Accountant, mem *testworld.MemReader, claims [][]*resourceapi.ResourceClaim, i int, c *resourceapi.ResourceClaim) {
	t := i % len(claims)
	c.ResourceVersion = "1"
	mem.Put(c)
	mem.Remove(claims[t][0])
	claims[t] = append(claims[t][1:], c)
	acct.ClaimChanged(c.Namespace) // what the claim informer's handler does
}

// reportLatency reports percentiles and, for back-to-back runs (capacity),
// claims/s of one caller: the number of claims over the time spent in them.
func reportLatency(b *testing.B, lat []time.Duration, capacity bool) {
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	pct := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))]) / 1e6 }
	var total time.Duration
	for _, l := range lat {
		total += l
	}
	if capacity {
		b.ReportMetric(float64(len(lat))/total.Seconds(), "claims/s")
	}
	b.ReportMetric(pct(0.50), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
}

// BenchmarkClaimAdmissionParallel: callers on every CPU at once (the
// apiserver sends concurrent requests); decisions are serialized, so this
// shows the lock's cost.
func BenchmarkClaimAdmissionParallel(b *testing.B) {
	mem, _ := benchCluster(b)
	acct := quotaadmission.NewAccountant(mem, mem, quotaadmission.NewLedger(benchBooks(b), "gpuaas"))
	acct.ClaimChanged("") // an informer would be feeding it
	h, _ := newClaimWebhook(b, acct)
	ctx := context.Background()
	var mu sync.Mutex
	var lat []time.Duration
	var seq int64
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		var mine []time.Duration
		for pb.Next() {
			mu.Lock()
			seq++
			i := seq
			mu.Unlock()
			c := claim(fmt.Sprintf("tenant-%d", i%benchTenants), fmt.Sprintf("par-%d", i), "mig-1g", 1)
			req := request(b, admissionv1.Create, c.Namespace, c.Name, c)
			req.DryRun = ptrTrue() // no reservations pile up without a cache catching up
			start := time.Now()
			if resp := h.Handle(ctx, req); !resp.Allowed {
				b.Errorf("denied: %s", resp.Result.Message)
				return
			}
			mine = append(mine, time.Since(start))
		}
		mu.Lock()
		lat = append(lat, mine...)
		mu.Unlock()
	})
	reportLatency(b, lat, false) // throughput: 1e9 / ns/op
}

func ptrTrue() *bool { t := true; return &t }

// BenchmarkClaimAdmissionAt200PerSecond sends claims at the budget's rate,
// 200 per second (one every 5 ms), and reports the latency percentiles; the
// DESIGN budget is p99 under 5 ms. ns/op is the pacing, not the cost. It
// runs on the default cluster (20 tenants, 2,000 claims) and at the scale
// of issue 12 item 13: 1,000 tenants (in 2 cohorts of 500) and 10,000
// claims.
func BenchmarkClaimAdmissionAt200PerSecond(b *testing.B) {
	for _, size := range []struct{ tenants, perTenant int }{{benchTenants, benchClaimsPerTenant}, {1000, 10}} {
		b.Run(fmt.Sprintf("tenants=%d/claims=%d", size.tenants, size.tenants*size.perTenant), func(b *testing.B) {
			benchPaced(b, size.tenants, size.perTenant)
		})
	}
}

func benchPaced(b *testing.B, tenants, perTenant int) {
	mem, claims := benchClusterOf(b, tenants, perTenant)
	acct := quotaadmission.NewAccountant(mem, mem, quotaadmission.NewLedger(benchBooks(b), "gpuaas"))
	h, _ := newClaimWebhook(b, acct)
	ctx := context.Background()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	var lat []time.Duration
	for i := 0; b.Loop(); i++ {
		<-tick.C
		c := claim(fmt.Sprintf("tenant-%d", i%tenants), fmt.Sprintf("paced-%d", i), []string{"h100", "mig-1g"}[i%2], 1)
		req := request(b, admissionv1.Create, c.Namespace, c.Name, c)
		start := time.Now()
		if resp := h.Handle(ctx, req); !resp.Allowed {
			b.Fatalf("denied: %s", resp.Result.Message)
		}
		lat = append(lat, time.Since(start))
		// The claim admitted is the one the cache then shows, so its
		// reservation settles as in a cluster (a claim of another name
		// and UID left every reservation in the book for its whole
		// grace period: 35 s of them, written with every admission).
		stored(acct, mem, claims, i, c)
	}
	reportLatency(b, lat, false)
}

// memBooks keeps the ledger's ConfigMaps in memory with the API's
// optimistic concurrency (resourceVersion preconditions). The fake client
// builds a REST mapper for every update, half the CPU of the paced
// benchmark, which no real write costs; a real write's cost (an etcd
// write) is measured through the control plane (test/e2e). BENCH_BOOKS=fake
// measures with the fake client again.
type memBooks struct {
	client.WithWatch // the rest of the interface, which the ledger does not use
	mu               sync.Mutex
	cms              map[types.NamespacedName]*corev1.ConfigMap
	version          int
}

// benchBooks is where the benchmarks' ledger keeps its books.
func benchBooks(b *testing.B) client.WithWatch {
	if os.Getenv("BENCH_BOOKS") == "fake" {
		return newFakeClient(b)
	}
	return &memBooks{WithWatch: newFakeClient(b), cms: map[types.NamespacedName]*corev1.ConfigMap{}}
}

func (m *memBooks) Get(_ context.Context, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	cm, ok := m.cms[key]
	if !ok {
		return apierrors.NewNotFound(corev1.Resource("configmaps"), key.Name)
	}
	cm.DeepCopyInto(obj.(*corev1.ConfigMap))
	return nil
}

func (m *memBooks) Create(_ context.Context, obj client.Object, _ ...client.CreateOption) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	key := client.ObjectKeyFromObject(obj)
	if _, ok := m.cms[key]; ok {
		return apierrors.NewAlreadyExists(corev1.Resource("configmaps"), key.Name)
	}
	return m.storeLocked(key, obj.(*corev1.ConfigMap))
}

func (m *memBooks) Update(_ context.Context, obj client.Object, _ ...client.UpdateOption) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	key := client.ObjectKeyFromObject(obj)
	have, ok := m.cms[key]
	if !ok {
		return apierrors.NewNotFound(corev1.Resource("configmaps"), key.Name)
	}
	if obj.GetResourceVersion() != have.ResourceVersion {
		return apierrors.NewConflict(corev1.Resource("configmaps"), key.Name, errors.New("the object has been modified"))
	}
	return m.storeLocked(key, obj.(*corev1.ConfigMap))
}

func (m *memBooks) storeLocked(key client.ObjectKey, cm *corev1.ConfigMap) error {
	m.version++
	cm.ResourceVersion = strconv.Itoa(m.version)
	m.cms[key] = cm.DeepCopy()
	return nil
}
