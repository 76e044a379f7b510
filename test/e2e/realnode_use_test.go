package e2e

import (
	"context"
	"fmt"
	"maps"
	"math"
	"math/big"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller/billing"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev/nvmock"
	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

// trainerSM is the SM utilization the simulated GPU reports for the busy
// trainer's container process.
const trainerSM = 70

// testUseAndIdlePolicy: what the chart's plugin measures of two pods on one
// time-sliced GPU, through the production NVML path (the simulated
// libnvidia-ml.so.1), and what the chart's controller does with it. The
// trainer's container's host PID runs at 70% of the GPU (set on the
// simulated machine, as a CUDA process would show in NVML), the notebook's
// runs nothing: the plugin maps the PID through /proc/<pid>/cgroup to the
// trainer's pod and claim, so the metrics put 70% on the trainer's claim and
// 0 on the notebook's. Under a tenant policy of 5% for 1m with Evict, the
// notebook's pod is evicted with an event naming the policy, and the
// trainer keeps running.
//
// On the same run (its setup and its wait for the policy shared), the
// other kinds of device are measured with known values (useKinds: a whole
// GPU, a MIG device by GPM, an MPS client), a claim whose use NVML cannot
// tell is never acted on, and one whose plugin restarted is acted on only
// for the idleness the new process saw (useRestart).
func testUseAndIdlePolicy(t *testing.T, n *realNode) {
	ctx := framework.Context(t, 12*time.Minute)
	applySharingClasses(t, ctx)
	ns := cp.CreateNamespace(t, "real-use")
	tenant := uniqueName("real-use")
	q := quotaFor(tenant, []string{ns}, gpuaas.QuotaLimits{})
	q.Spec.IdlePolicy = &gpuaas.IdlePolicy{ThresholdPercent: 5, Duration: metav1.Duration{Duration: time.Minute}, Action: gpuaas.IdleActionEvict}
	createObject(t, q)
	waitForQuotaNamespace(t, tenant, ns)

	gpu := gpuUUIDOf(t, ctx, n.Name, longIntervalGPU)
	pods := map[string]*v1.Pod{}
	for _, name := range []string{"trainer", "notebook"} {
		tmpl := templateFor(name, ns, "timeslice.gpuaas.io")
		tmpl.Spec.Spec.Devices.Requests[0].Exactly.Selectors = celSelectors(onLongGPU)
		if _, err := cp.Client.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		pods[name] = createAndRun(t, ctx, templateWorkloadPod(ns, name, name))
	}
	trainer, notebook := pods["trainer"], pods["notebook"]
	pid, err := framework.ContainerHostPID("/proc", trainer.Status.ContainerStatuses[0].ContainerID)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Machine().SetProcessUse(gpu, nvmock.ProcessUse{PID: pid, Name: "python", SMUtil: trainerSM, MemoryUsed: 2 << 30}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Machine().EndProcess(pid) })
	t.Logf("the trainer's container process %d runs at %d%% of GPU %s", pid, trainerSM, gpu)
	kinds := startUseKinds(t, ctx, n, ns)

	want := map[string]float64{"trainer": trainerSM, "notebook": 0}
	maps.Copy(want, kinds.want)
	got := waitForClaimUse(t, ctx, ns, want)
	t.Logf("the plugin measured, per pod: %v", got)
	kinds.checkUnknown(t, ctx)
	// Started now, so that it is idle for less than its policy's duration
	// when the plugin restarts.
	// Its first runs found a defect: a new process that tracked its claims
	// within the second it started wrote an idleness older than its use
	// Lease, refused for as long as it lasted (usage.ceilSecond).
	restart := newUseRestart(t, ctx, n)
	restart.restartPlugin(t, ctx)

	err = wait.PollUntilContextCancel(ctx, time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := cp.Client.CoreV1().Pods(ns).Get(ctx, notebook.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		t.Fatalf("the idle notebook was not evicted: %v", err)
	}
	if _, err := cp.WaitForEvent(ctx, ns, "Pod", notebook.Name, "IdleEvicted", "policy tenantquota/"+tenant, "below 5% for 1m0s"); err != nil {
		t.Error(err)
	}
	delete(want, "notebook")
	got = waitForClaimUse(t, ctx, ns, want)
	t.Logf("after the evictions the plugin measured, per pod: %v", got)
	restart.checkActedOnNewIdleness(t, ctx)

	// By now the claim of unknown use has been held past the policy's
	// duration (under the new process as well).
	for _, p := range append([]*v1.Pod{trainer}, kinds.pods...) {
		got, err := cp.Client.CoreV1().Pods(ns).Get(ctx, p.Name, metav1.GetOptions{})
		if err != nil || got.UID != p.UID || got.DeletionTimestamp != nil || got.Status.Phase != v1.PodRunning {
			t.Errorf("pod %s (busy, or of unknown use) after the idle pods' evictions: %v; want it running", p.Name, err)
		}
	}
	kinds.checkNeverWarned(t, ctx)
	for _, p := range append([]*v1.Pod{trainer}, kinds.pods...) {
		deletePodAndWait(t, ctx, p)
	}
	checkUseBilled(t, tenant, podClaimName(t, notebook), podClaimName(t, trainer))
}

// checkUseBilled: the tenant's closed records split each claim's time by
// the use its plugin reported: the evicted notebook's has idle
// unit-seconds (its device was Idle=True for the policy's minute before
// the eviction), the busy trainer's used ones.
func checkUseBilled(t *testing.T, tenant, notebookClaim, trainerClaim string) {
	t.Helper()
	name := billing.UsageName(tenant, time.Now().UTC().Format("2006-01"))
	closed := func(u *gpuaas.TenantUsage, claim string) *gpuaas.UsageRecord {
		for i := range u.Status.Recent {
			if u.Status.Recent[i].Claim == claim {
				return &u.Status.Recent[i]
			}
		}
		return nil
	}
	u := waitForUsage(t, name, "with the notebook's and the trainer's records closed", func(u *gpuaas.TenantUsage) bool {
		return closed(u, notebookClaim) != nil && closed(u, trainerClaim) != nil
	})
	positive := func(s string) bool { r, ok := new(big.Rat).SetString(s); return ok && r.Sign() > 0 }
	if rec := closed(u, notebookClaim); !positive(rec.IdleUnitSeconds) {
		t.Errorf("the evicted idle notebook's record: %s idle unit-seconds (used %s, unknown %s of %s); want some idle: %+v",
			rec.IdleUnitSeconds, rec.UsedUnitSeconds, rec.UnknownUseUnitSeconds, rec.UnitSeconds, *rec)
	}
	if rec := closed(u, trainerClaim); !positive(rec.UsedUnitSeconds) {
		t.Errorf("the busy trainer's record: %s used unit-seconds (idle %s, unknown %s of %s); want some used: %+v",
			rec.UsedUnitSeconds, rec.IdleUnitSeconds, rec.UnknownUseUnitSeconds, rec.UnitSeconds, *rec)
	}
}

// The values the simulated machine sets for the other kinds of device.
const (
	wholeSM = 55 // the whole GPU's SM utilization
	migSM   = 35 // the MIG device's GPU instance's SM activity (GPM)
	mpsSM   = 25 // the MPS client's share of its GPU
)

// Whole GPUs of the demo node (0-3) for the busy and the unknown claim.
const (
	wholeGPUIndex   = 0
	unknownGPUIndex = 1
)

// useKinds are pods on the other kinds of device in the use step's
// namespace, each running at a known use: a whole GPU, a MIG device
// (dynamic MIG, measured by GPM), an MPS client (its container's host PID
// on the MPS GPU). One more holds a whole GPU whose use calls answer
// NOT_SUPPORTED: its use is unknown, and the idle policy must never act on
// it (unknown is not idle).
type useKinds struct {
	ns   string
	want map[string]float64 // pod -> utilization percent
	pods []*v1.Pod          // every pod that must keep running
	// unknown is the pod whose use is unknown, unknownClaim its claim.
	unknown      *v1.Pod
	unknownClaim string
}

func startUseKinds(t *testing.T, ctx context.Context, n *realNode, ns string) *useKinds {
	t.Helper()
	k := &useKinds{ns: ns, want: map[string]float64{}}
	m := n.Machine()
	onIndex := func(i int) string {
		return fmt.Sprintf(`device.attributes["gpu.gpuaas.io"].type == "gpu" && device.attributes["gpu.gpuaas.io"].index == %d`, i)
	}

	unknownGPU := gpuUUIDOf(t, ctx, n.Name, unknownGPUIndex)
	if err := m.SetUseSupported(unknownGPU, false); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.SetUseSupported(unknownGPU, true) })
	k.unknown = k.run(t, ctx, "unknown", "gpu.gpuaas.io", onIndex(unknownGPUIndex))
	k.unknownClaim = podClaimName(t, k.unknown)

	wholeGPU := gpuUUIDOf(t, ctx, n.Name, wholeGPUIndex)
	if err := m.SetGPUUse(wholeGPU, nvmock.GPUUse{SMUtil: wholeSM, MemoryUsed: 3 << 30}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.SetGPUUse(wholeGPU, nvmock.GPUUse{}) })
	k.run(t, ctx, "whole", "gpu.gpuaas.io", onIndex(wholeGPUIndex))
	k.want["whole"] = wholeSM

	if suiteShape(t).dynamicMIG {
		pod := k.run(t, ctx, "mig", "mig.gpuaas.io", `device.attributes["gpu.gpuaas.io"].profile == "1g.10gb"`)
		_, data := deviceStatus(t, ctx, ns, podClaimName(t, pod), "Ready with the MIG device's IDs", func(d resourceapi.AllocatedDeviceStatus) bool {
			return conditionIs(d, "Ready", metav1.ConditionTrue)
		})
		if data.MIGUUID == "" {
			t.Fatalf("the MIG claim's device status has no MIG UUID: %+v", data)
		}
		if err := m.SetMIGUse(data.MIGUUID, nvmock.MIGUse{SMActivity: migSM, MemoryUsed: 1 << 30}); err != nil {
			t.Fatal(err)
		}
		k.want["mig"] = migSM
	} else {
		t.Log("no dynamic MIG on this API server: the MIG device's GPM measurement is not shown")
	}

	if suiteShape(t).shares {
		pod := k.run(t, ctx, "mps", "shared.gpuaas.io", onMPSGPU)
		pid, err := framework.ContainerHostPID("/proc", pod.Status.ContainerStatuses[0].ContainerID)
		if err != nil {
			t.Fatal(err)
		}
		if err := m.SetProcessUse(gpuUUIDOf(t, ctx, n.Name, mpsGPU), nvmock.ProcessUse{PID: pid, Name: "python", SMUtil: mpsSM, MemoryUsed: 1 << 30}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = m.EndProcess(pid) })
		k.want["mps"] = mpsSM
	} else {
		t.Log("no consumable capacity on this API server: no MPS GPU published, the MPS client's measurement is not shown")
	}
	return k
}

// run runs a pod with one claim (from a template of its name) of one
// device of class matching cel.
func (k *useKinds) run(t *testing.T, ctx context.Context, name, class, cel string) *v1.Pod {
	t.Helper()
	tmpl := templateFor(name, k.ns, class)
	tmpl.Spec.Spec.Devices.Requests[0].Exactly.Selectors = celSelectors(cel)
	if _, err := cp.Client.ResourceV1().ResourceClaimTemplates(k.ns).Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := createAndRun(t, ctx, templateWorkloadPod(k.ns, name, name))
	k.pods = append(k.pods, pod)
	return pod
}

// checkUnknown: the claim of unknown use has no utilization series (absent,
// never 0: waitForClaimUse counted every series of the namespace),
// gpuaas_claim_gpu_use_known 0, and its Idle condition Unknown/UseUnknown.
func (k *useKinds) checkUnknown(t *testing.T, ctx context.Context) {
	t.Helper()
	plugin := waitForPluginPod(t, ctx, "")
	err := wait.PollUntilContextTimeout(ctx, 2*time.Second, time.Minute, true, func(ctx context.Context) (bool, error) {
		body, err := scrapeComponent(ctx, plugin, "kubelet-plugin", "")
		if err != nil {
			return false, nil
		}
		v, ok := claimGauge(body, "gpuaas_claim_gpu_use_known", k.ns, k.unknownClaim)
		return ok && v == 0, nil
	})
	if err != nil {
		t.Errorf("gpuaas_claim_gpu_use_known of claim %s (NVML answers NOT_SUPPORTED): want 0: %v", k.unknownClaim, err)
	}
	st, _ := deviceStatus(t, ctx, k.ns, k.unknownClaim, "Idle Unknown/UseUnknown", func(d resourceapi.AllocatedDeviceStatus) bool {
		c := meta.FindStatusCondition(d.Conditions, gpuaas.DeviceConditionIdle)
		return c != nil && c.Status == metav1.ConditionUnknown && c.Reason == gpuaas.ReasonIdleUseUnknown
	})
	t.Logf("claim %s of unknown use: %+v", k.unknownClaim, meta.FindStatusCondition(st.Conditions, gpuaas.DeviceConditionIdle))
}

// checkNeverWarned: the idle policy neither warned of nor acted on the
// claim of unknown use, nor its pod.
func (k *useKinds) checkNeverWarned(t *testing.T, ctx context.Context) {
	t.Helper()
	events, err := cp.Client.CoreV1().Events(k.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range events.Items {
		o := e.InvolvedObject
		if strings.HasPrefix(e.Reason, "Idle") && (o.Name == k.unknownClaim || o.Name == k.unknown.Name) {
			t.Errorf("the idle policy acted on the claim of unknown use: %s %s/%s: %s", e.Reason, o.Kind, o.Name, e.Message)
		}
	}
}

// useRestart is an idle pod under a policy long enough (5% for 2m, Evict)
// that its plugin restarts before the policy's duration is over: the
// idleness the old process saw must never be acted on once the new
// process renews the use Lease; the pod is evicted only for an idleness
// that began after the new process started.
type useRestart struct {
	ns, tenant string
	pod        *v1.Pod
	lease      string
	// renewedAt is when the test saw the new process's Lease; acquired is
	// that process's start (the Lease's acquireTime).
	renewedAt, acquired time.Time
}

func newUseRestart(t *testing.T, ctx context.Context, n *realNode) *useRestart {
	t.Helper()
	r := &useRestart{ns: cp.CreateNamespace(t, "real-use-restart"), tenant: uniqueName("real-use-restart"), //nolint:contextcheck // the test helpers clean up after the test, past its context
		lease: gpuaas.UseLeasePrefix + n.Name}
	q := quotaFor(r.tenant, []string{r.ns}, gpuaas.QuotaLimits{})
	q.Spec.IdlePolicy = &gpuaas.IdlePolicy{ThresholdPercent: 5, Duration: metav1.Duration{Duration: 2 * time.Minute}, Action: gpuaas.IdleActionEvict}
	createObject(t, q)                       //nolint:contextcheck // the test helpers clean up after the test, past its context
	waitForQuotaNamespace(t, r.tenant, r.ns) //nolint:contextcheck // the test helpers clean up after the test, past its context
	tmpl := templateFor("idle", r.ns, "timeslice.gpuaas.io")
	tmpl.Spec.Spec.Devices.Requests[0].Exactly.Selectors = celSelectors(onLongGPU)
	if _, err := cp.Client.ResourceV1().ResourceClaimTemplates(r.ns).Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	r.pod = createAndRun(t, ctx, templateWorkloadPod(r.ns, "idle", "idle"))
	return r
}

// restartPlugin waits until the old plugin process has seen the pod idle
// (its Idle condition True), deletes the plugin pod, and waits for the new
// process's Lease.
func (r *useRestart) restartPlugin(t *testing.T, ctx context.Context) {
	t.Helper()
	st, _ := deviceStatus(t, ctx, r.ns, podClaimName(t, r.pod), "Idle True (seen by the first plugin process)", func(d resourceapi.AllocatedDeviceStatus) bool {
		return conditionIs(d, gpuaas.DeviceConditionIdle, metav1.ConditionTrue)
	})
	since := meta.FindStatusCondition(st.Conditions, gpuaas.DeviceConditionIdle).LastTransitionTime.Time
	old, err := cp.Client.CoordinationV1().Leases(releaseNamespace).Get(ctx, r.lease, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	plugin := waitForPluginPod(t, ctx, "")
	if err := cp.Client.CoreV1().Pods(releaseNamespace).Delete(ctx, plugin.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitForPluginPod(t, ctx, plugin.UID)
	err = wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		l, err := cp.Client.CoordinationV1().Leases(releaseNamespace).Get(ctx, r.lease, metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil || l.Spec.AcquireTime == nil ||
			*l.Spec.HolderIdentity == ptr.Deref(old.Spec.HolderIdentity, "") {
			return false, nil
		}
		r.acquired, r.renewedAt = l.Spec.AcquireTime.Time, time.Now()
		return true, nil
	})
	if err != nil {
		t.Fatalf("use Lease %s not renewed by a new plugin process (was %s): %v", r.lease, ptr.Deref(old.Spec.HolderIdentity, ""), err)
	}
	t.Logf("the first plugin process saw pod %s idle since %s; a new process started at %s renews the use Lease",
		r.pod.Name, since.UTC().Format(time.RFC3339), r.acquired.UTC().Format(time.RFC3339))
	if !since.Add(2 * time.Minute).After(r.renewedAt) {
		t.Fatalf("the plugin restarted (%s) after the first process's idleness (since %s) was past the policy's 2m: the restart is not shown",
			r.renewedAt.UTC().Format(time.RFC3339), since.UTC().Format(time.RFC3339))
	}
}

// checkActedOnNewIdleness: the pod is evicted for an idleness the new
// process saw (its event's "idle since" not before the process started),
// never for the one the old process saw.
func (r *useRestart) checkActedOnNewIdleness(t *testing.T, ctx context.Context) {
	t.Helper()
	e, err := cp.WaitForEvent(ctx, r.ns, "Pod", r.pod.Name, "IdleEvicted", "policy tenantquota/"+r.tenant, "below 5% for 2m0s")
	if err != nil {
		t.Fatal(err)
	}
	since, err := idleSince(e.Message)
	if err != nil {
		t.Fatal(err)
	}
	if since.Before(r.acquired.Truncate(time.Second)) {
		t.Errorf("pod %s evicted for an idleness since %s, before its plugin restarted (%s): %s",
			r.pod.Name, since.UTC().Format(time.RFC3339), r.acquired.UTC().Format(time.RFC3339), e.Message)
	}
	t.Logf("evicted for the idleness the new plugin process saw: %s", e.Message)
}

// idleSince reads the "idle since T" of an idle policy's message.
func idleSince(msg string) (time.Time, error) {
	_, rest, ok := strings.Cut(msg, " idle since ")
	if !ok {
		return time.Time{}, fmt.Errorf("no \"idle since\" in %q", msg)
	}
	ts, _, _ := strings.Cut(rest, " ")
	return time.Parse(time.RFC3339, ts)
}

// podClaimName is the name of the claim generated for a pod's only
// template claim.
func podClaimName(t *testing.T, pod *v1.Pod) string {
	t.Helper()
	for _, s := range pod.Status.ResourceClaimStatuses {
		if s.ResourceClaimName != nil {
			return *s.ResourceClaimName
		}
	}
	t.Fatalf("pod %s has no generated claim in its status", pod.Name)
	return ""
}

// waitForClaimUse scrapes the chart's plugin until its utilization series
// for the pods of ns are those of want (pod name -> percent of the GPU),
// and returns what it read last.
func waitForClaimUse(t *testing.T, ctx context.Context, ns string, want map[string]float64) map[string]float64 {
	t.Helper()
	plugin := waitForPluginPod(t, ctx, "")
	var got map[string]float64
	var last error
	err := wait.PollUntilContextTimeout(ctx, 2*time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		body, err := scrapeComponent(ctx, plugin, "kubelet-plugin", "")
		if err != nil {
			last = err
			return false, nil
		}
		got, last = claimUtilization(body, ns)
		if last != nil || len(got) != len(want) {
			return false, nil
		}
		for pod, pct := range want {
			// GPM's SM activity is a mean of two samples' counters: 35 may
			// read as 34.999999999999986.
			if v, ok := got[pod]; !ok || math.Abs(v-pct) > 0.01 {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("the plugin's gpuaas_claim_gpu_utilization_percent for namespace %s: %v, want %v (%v)", ns, got, want, last)
	}
	return got
}

// claimUtilization reads gpuaas_claim_gpu_utilization_percent of a
// namespace's pods from a /metrics page, by pod name.
func claimUtilization(body, ns string) (map[string]float64, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("parsing /metrics: %w", err)
	}
	out := map[string]float64{}
	f := families["gpuaas_claim_gpu_utilization_percent"]
	if f == nil {
		return out, nil
	}
	for _, m := range f.GetMetric() {
		labels := labelMap(m.GetLabel())
		if labels["namespace"] == ns && m.GetGauge() != nil {
			out[labels["pod"]] = m.GetGauge().GetValue()
		}
	}
	return out, nil
}

// claimGauge is a gauge of ours of one claim of a namespace on a
// /metrics page (its first series).
func claimGauge(body, metric, ns, claim string) (float64, bool) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(body))
	if err != nil || families[metric] == nil {
		return 0, false
	}
	for _, m := range families[metric].GetMetric() {
		labels := labelMap(m.GetLabel())
		if labels["namespace"] == ns && labels["claim"] == claim && m.GetGauge() != nil {
			return m.GetGauge().GetValue(), true
		}
	}
	return 0, false
}

func labelMap(pairs []*dto.LabelPair) map[string]string {
	out := make(map[string]string, len(pairs))
	for _, p := range pairs {
		out[p.GetName()] = p.GetValue()
	}
	return out
}
