package e2e

import (
	"context"
	"fmt"
	"math/big"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller/billing"
	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

// billingTolerance bounds how far a record's start or end may lie from
// the test's own observation of the allocation appearing or the claim
// going. A record's times are the leader's clock truncated to the whole
// second (up to 1 s earlier than the leader saw it), and the leader sees
// the change through its watch and work queue, the test through a
// 100 ms List poll (docs/platform.md, "Billing": "Times are whole
// seconds"); both clocks are this machine's.
const billingTolerance = 1500 * time.Millisecond

// billingOutage is how long the step stops the API server.
const billingOutage = 20 * time.Second

// billedKind is one kind of claim the step holds: a template of one
// device of class, matching cel.
type billedKind struct {
	name, class, cel string
	units            string // the units the record must carry ("" : logged only)
}

// billedClaim is what the test itself saw of one claim.
type billedClaim struct {
	kind      billedKind
	pod       *v1.Pod
	claim     string
	device    string    // pool/device
	allocated time.Time // when the test first saw status.allocation
	written   time.Time // the allocation's status write (managedFields, whole seconds)
	gone      time.Time // when the test first saw the claim gone
}

// TestRealNodeBilling runs testBillingRecordsExact on a real node of its
// own with the chart installed. It is not in `make test` (make
// e2e-recovery): its two leader kills and an API server outage took 132 s
// of TestRealNode, past the suite's budget (docs/development.md).
func TestRealNodeBilling(t *testing.T) {
	requireRealNode(t)
	n := startRealNode(t)
	installChartForTest(t, n)
	testBillingRecordsExact(t, n)
}

// testBillingRecordsExact (issue 58, "Must show"): claims of every kind on
// the real node, allocated by the scheduler and deleted, while the
// chart's controller leader is killed twice and the API server stopped
// once; the tenant's TenantUsage then holds, per claim, records that
// tile [allocated, gone) as the test saw it, to the second, each billed
// its units times its seconds, exactly, and nothing twice.
func testBillingRecordsExact(t *testing.T, n *realNode) {
	ctx := framework.Context(t, 6*time.Minute)
	installCRDs(t)
	applySharingClasses(t, ctx)
	ns := cp.CreateNamespace(t, "real-billing")
	tenant := uniqueName("real-billing")
	createObject(t, quotaFor(tenant, []string{ns}, gpuaas.QuotaLimits{}))
	waitForQuotaNamespace(t, tenant, ns)
	usage := billing.UsageName(tenant, time.Now().UTC().Format("2006-01"))

	w := watchClaims(ctx, ns)
	held := map[string]*billedClaim{}
	for _, k := range billedKinds(t) {
		held[k.name] = w.run(t, ctx, k, ns)
	}
	waitForUsage(t, usage, "one open record per claim", func(u *gpuaas.TenantUsage) bool { return len(u.Status.Open) == len(held) })

	killLeaderAndWait(t, ctx, usage)
	w.end(t, ctx, held["timeslice"])
	stopAPIServerAndWait(t, ctx, usage)
	if c := held["mig"]; c != nil {
		w.end(t, ctx, c)
	}
	killLeaderAndWait(t, ctx, usage)
	for _, c := range held {
		if c.gone.IsZero() {
			w.end(t, ctx, c)
		}
	}
	u := waitForUsage(t, usage, "every record closed", func(u *gpuaas.TenantUsage) bool { return len(u.Status.Open) == 0 })
	checkBilledExactly(t, u, held)
}

// billedKinds are the claims of the step: a whole GPU, a time-slice
// replica of the Long-interval GPU, a 1g MIG slice (dynamic MIG) and a
// memory share of the MPS GPU (consumable capacity), as far as this API
// server serves them.
func billedKinds(t *testing.T) []billedKind {
	t.Helper()
	kinds := []billedKind{
		{"whole", "gpu.gpuaas.io", `device.attributes["gpu.gpuaas.io"].type == "gpu"`, "1"},
		{"timeslice", "timeslice.gpuaas.io", onLongGPU, ""},
	}
	if suiteShape(t).dynamicMIG {
		kinds = append(kinds, billedKind{"mig", "mig.gpuaas.io", `device.attributes["gpu.gpuaas.io"].profile == "1g.10gb"`, "1/7"})
	} else {
		t.Log("no dynamic MIG on this API server: no MIG claim billed")
	}
	if suiteShape(t).shares {
		kinds = append(kinds, billedKind{"share", "shared.gpuaas.io", onMPSGPU, ""})
	} else {
		t.Log("no consumable capacity on this API server: no memory share billed")
	}
	return kinds
}

// claimWatch polls the namespace's claims every 100 ms (a List, which
// goes on failing while the API server is down, where no claim changes)
// and notes when each was first seen allocated and first seen gone.
type claimWatch struct {
	mu        sync.Mutex
	allocated map[string]time.Time
	written   map[string]time.Time
	gone      map[string]time.Time
}

func watchClaims(ctx context.Context, ns string) *claimWatch {
	w := &claimWatch{allocated: map[string]time.Time{}, written: map[string]time.Time{}, gone: map[string]time.Time{}}
	go func() {
		_ = wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
			list, err := cp.Client.ResourceV1().ResourceClaims(ns).List(ctx, metav1.ListOptions{})
			if err == nil {
				w.saw(list.Items, time.Now())
			}
			return false, nil
		})
	}()
	return w
}

func (w *claimWatch) saw(claims []resourceapi.ResourceClaim, now time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	present := map[string]bool{}
	for i := range claims {
		c := &claims[i]
		present[c.Name] = true
		if _, ok := w.allocated[c.Name]; !ok && c.Status.Allocation != nil {
			w.allocated[c.Name], w.written[c.Name] = now, allocationWritten(c)
		}
	}
	for name := range w.allocated {
		if _, ok := w.gone[name]; !ok && !present[name] {
			w.gone[name] = now
		}
	}
}

// allocationWritten is the time of the managedFields entry that wrote the
// claim's status.allocation (the API server's clock, whole seconds).
func allocationWritten(c *resourceapi.ResourceClaim) time.Time {
	for _, f := range c.ManagedFields {
		if f.Subresource == "status" && f.FieldsV1 != nil && strings.Contains(f.FieldsV1.GetRawString(), `"f:allocation"`) && f.Time != nil {
			return f.Time.Time
		}
	}
	return time.Time{}
}

func (w *claimWatch) times(name string) (allocated, written, gone time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.allocated[name], w.written[name], w.gone[name]
}

// run runs a pod with one claim of kind k and returns what the test saw
// of its allocation.
func (w *claimWatch) run(t *testing.T, ctx context.Context, k billedKind, ns string) *billedClaim {
	t.Helper()
	tmpl := templateFor(k.name, ns, k.class)
	tmpl.Spec.Spec.Devices.Requests[0].Exactly.Selectors = celSelectors(k.cel)
	if _, err := cp.Client.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := createAndRun(t, ctx, templateWorkloadPod(ns, k.name, k.name))
	c := &billedClaim{kind: k, pod: pod, claim: podClaimName(t, pod)}
	claim, err := cp.Client.ResourceV1().ResourceClaims(ns).Get(ctx, c.claim, metav1.GetOptions{})
	if err != nil || claim.Status.Allocation == nil {
		t.Fatalf("claim %s of running pod %s: %v, allocation %v", c.claim, k.name, err, claim.Status.Allocation)
	}
	r := claim.Status.Allocation.Devices.Results[0]
	c.device = r.Pool + "/" + r.Device
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		c.allocated, c.written, _ = w.times(c.claim)
		return !c.allocated.IsZero(), nil
	})
	if err != nil {
		t.Fatalf("the claim poll never saw claim %s allocated: %v", c.claim, err)
	}
	return c
}

// end deletes the claim's pod (its template claim goes with it) and
// notes when the claim was gone.
func (w *claimWatch) end(t *testing.T, ctx context.Context, c *billedClaim) {
	t.Helper()
	deletePodAndWait(t, ctx, c.pod)
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) {
		_, _, c.gone = w.times(c.claim)
		return !c.gone.IsZero(), nil
	})
	if err != nil {
		t.Fatalf("claim %s of deleted pod %s not gone: %v", c.claim, c.pod.Name, err)
	}
}

// killLeaderAndWait deletes the chart's controller pod (its one replica,
// so the leader), waits until a new process holds the leader Lease and
// the webhook serves, and until the new leader continued every open
// record (a claim deleted before it did would be closed at the old
// leader's last checkpoint, endUncertain: documented, not what this step
// measures).
func killLeaderAndWait(t *testing.T, ctx context.Context, usage string) {
	t.Helper()
	killed := time.Now()
	was, leader, lease := replaceChartLeader(t, ctx, 200*time.Millisecond)
	acquired := lease.Spec.AcquireTime.Time
	waitRecordsSeenSince(t, usage, acquired, "continued by the new leader") //nolint:contextcheck // the test helpers poll under the test's own deadline
	t.Logf("leader pod %s (%s) deleted at %s; %s leads since %s", leader, was, clock(killed), *lease.Spec.HolderIdentity, clock(acquired))
}

// replaceChartLeader deletes the chart's controller pod (its one replica
// on this single node, so the leader) and waits, polling every poll, until
// a new process holds the leader Lease (named like the Deployment: the
// chart's --leader-elect-id; its holder is the host's name and a process
// UUID) and the webhook serves. It returns the former holder, the pod
// deleted and the new Lease.
func replaceChartLeader(t *testing.T, ctx context.Context, poll time.Duration) (was, pod string, now *coordinationv1.Lease) {
	t.Helper()
	leases := cp.Client.CoordinationV1().Leases(releaseNamespace)
	lease, err := leases.Get(ctx, controllerDeployment, metav1.GetOptions{})
	if err != nil || lease.Spec.HolderIdentity == nil {
		t.Fatalf("the controller's Lease: %v (%+v)", err, lease)
	}
	was = *lease.Spec.HolderIdentity
	pod = chartControllerReplica(t, ctx).pod
	if err := cp.Client.CoreV1().Pods(releaseNamespace).Delete(ctx, pod, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("deleting the leader pod %s (Lease holder %s): %v", pod, was, err)
	}
	err = wait.PollUntilContextTimeout(ctx, poll, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		l, err := leases.Get(ctx, controllerDeployment, metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "" || *l.Spec.HolderIdentity == was {
			return false, nil //nolint:nilerr // retried until the deadline
		}
		now = l
		return true, nil
	})
	if err != nil {
		t.Fatalf("the Lease is still held by %q: %v", was, err)
	}
	waitClaimWebhookServes(t, ctx)
	return was, pod, now
}

// stopAPIServerAndWait stops the API server for billingOutage (the
// leader loses its Lease and its process restarts, as
// testAPIServerOutage shows), starts it, and waits until a leader
// checkpointed every open record after it came back.
func stopAPIServerAndWait(t *testing.T, ctx context.Context, usage string) {
	t.Helper()
	if err := cp.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	time.Sleep(billingOutage)
	if err := cp.StartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	waitClaimWebhookServes(t, ctx)
	waitRecordsSeenSince(t, usage, back, "checkpointed after the API server came back") //nolint:contextcheck // the test helpers poll under the test's own deadline
	lease, err := cp.Client.CoordinationV1().Leases(releaseNamespace).Get(ctx, controllerDeployment, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("API server stopped %s to %s; %s leads since %s", clock(stopped), clock(back), *lease.Spec.HolderIdentity, clock(lease.Spec.AcquireTime.Time))
}

// waitRecordsSeenSince waits until every open record's lastSeen is at or
// after since (to the second: lastSeen is whole seconds).
func waitRecordsSeenSince(t *testing.T, usage string, since time.Time, what string) {
	t.Helper()
	from := metav1.NewTime(since.Truncate(time.Second))
	waitForUsage(t, usage, "every open record "+what, func(u *gpuaas.TenantUsage) bool {
		for _, rec := range u.Status.Open {
			if rec.LastSeen.Before(&from) {
				return false
			}
		}
		return true
	})
}

// checkBilledExactly compares the closed records with what the test saw:
// per claim, records of its device that tile [start, end) without gap or
// overlap, start and end within billingTolerance of the test's
// allocation and deletion, certain ends, and unitSeconds units × seconds
// exactly; no record of a claim the test did not hold; the usage's total
// their sum.
func checkBilledExactly(t *testing.T, u *gpuaas.TenantUsage, held map[string]*billedClaim) {
	t.Helper()
	byClaim := map[string][]gpuaas.UsageRecord{}
	for _, rec := range u.Status.Recent {
		byClaim[rec.Namespace+"/"+rec.Claim] = append(byClaim[rec.Namespace+"/"+rec.Claim], rec)
	}
	total := new(big.Rat)
	var table []string
	for _, name := range sortedKeys(held) {
		c := held[name]
		key := c.pod.Namespace + "/" + c.claim
		recs := byClaim[key]
		delete(byClaim, key)
		sort.Slice(recs, func(i, j int) bool { return recs[i].Start.Before(&recs[j].Start) })
		if len(recs) == 0 {
			t.Errorf("claim %s (%s, %s, allocated %s, gone %s): no record", key, name, c.device, clock(c.allocated), clock(c.gone))
			continue
		}
		for i, rec := range recs {
			total.Add(total, checkRecord(t, c, rec, i, recs))
			table = append(table, billingRow(c, rec))
		}
	}
	for key, recs := range byClaim {
		t.Errorf("records of claim %s, which the test did not hold: %+v", key, recs)
	}
	t.Logf("test's times vs the TenantUsage %s records (Δ = record - test):\n%-9s %-32s %-5s %-12s %-12s %-8s %-6s %-12s %-8s %-6s %-5s %s\n%s",
		u.Name, "kind", "device", "units", "allocated", "alloc-write", "start", "Δstart", "gone", "end", "Δend", "secs", "unit-seconds", strings.Join(table, "\n"))
	if u.Status.UnitSeconds != total.RatString() || u.Status.OpenRecords != 0 {
		t.Errorf("TenantUsage %s: %s unit-seconds, %d open; want %s (the records' sum), none open", u.Name, u.Status.UnitSeconds, u.Status.OpenRecords, total.RatString())
	}
}

// checkRecord checks record i of claim c's records and returns its
// unit-seconds as they must be.
func checkRecord(t *testing.T, c *billedClaim, rec gpuaas.UsageRecord, i int, recs []gpuaas.UsageRecord) *big.Rat {
	t.Helper()
	if rec.End == nil || rec.EndUncertain || rec.Device != c.device || (c.kind.units != "" && rec.Units != c.kind.units) {
		t.Errorf("record %d of claim %s: %+v; want device %s, units %q, closed for certain", i, c.claim, rec, c.device, c.kind.units)
		return new(big.Rat)
	}
	if i == 0 && !within(rec.Start.Time, c.allocated) {
		t.Errorf("claim %s (%s): record starts %s, the test saw it allocated at %s", c.claim, c.kind.name, clock(rec.Start.Time), clock(c.allocated))
	}
	if i > 0 && !rec.Start.Equal(recs[i-1].End) {
		t.Errorf("claim %s: record %d starts %s, the one before ends %s: split records must tile", c.claim, i, clock(rec.Start.Time), clock(recs[i-1].End.Time))
	}
	if i == len(recs)-1 && !within(rec.End.Time, c.gone) {
		t.Errorf("claim %s (%s): record ends %s, the test saw the claim gone at %s", c.claim, c.kind.name, clock(rec.End.Time), clock(c.gone))
	}
	want, ok := new(big.Rat).SetString(rec.Units)
	if !ok {
		t.Errorf("claim %s: units %q not a rational", c.claim, rec.Units)
		return new(big.Rat)
	}
	want.Mul(want, big.NewRat(int64(rec.End.Sub(rec.Start.Time)/time.Second), 1))
	if got, ok := new(big.Rat).SetString(rec.UnitSeconds); !ok || got.Cmp(want) != 0 {
		t.Errorf("claim %s: record %d has %s unit-seconds, want %s: units %s × [%s, %s)", c.claim, i, rec.UnitSeconds, want.RatString(), rec.Units, clock(rec.Start.Time), clock(rec.End.Time))
	}
	return want
}

func within(record, test time.Time) bool {
	d := record.Sub(test)
	return d >= -billingTolerance && d <= billingTolerance
}

func billingRow(c *billedClaim, rec gpuaas.UsageRecord) string {
	return fmt.Sprintf("%-9s %-32s %-5s %-12s %-12s %-8s %+6.2f %-12s %-8s %+6.2f %-5d %s",
		c.kind.name, rec.Device, rec.Units, clock(c.allocated), clock(c.written), rec.Start.UTC().Format(time.TimeOnly),
		rec.Start.Sub(c.allocated).Seconds(), clock(c.gone), rec.End.UTC().Format(time.TimeOnly), rec.End.Sub(c.gone).Seconds(),
		int64(rec.End.Sub(rec.Start.Time)/time.Second), rec.UnitSeconds)
}

// clock is a time of day in UTC to the millisecond.
func clock(at time.Time) string { return at.UTC().Format("15:04:05.000") }

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
