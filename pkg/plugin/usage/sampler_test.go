package usage

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	gpuaasv1 "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/mig"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/checkpoint"
)

// fakeNVML is an nvdev.Interface over go-nvml mock devices by UUID.
type fakeNVML struct {
	nvdev.Interface
	devices map[string]nvml.Device
	lib     *mock.Interface
}

func (f *fakeNVML) DeviceByUUID(uuid string) (nvml.Device, error) {
	if d, ok := f.devices[uuid]; ok {
		return d, nil
	}
	return nil, nvml.ERROR_GPU_IS_LOST
}

func (f *fakeNVML) NVML() nvml.Interface { return f.lib }

// gpu is a mock GPU at util percent with used bytes of memory.
func gpu(util uint32, used uint64) *mock.Device {
	return &mock.Device{
		GetUtilizationRatesFunc: func() (nvml.Utilization, nvml.Return) { return nvml.Utilization{Gpu: util}, nvml.SUCCESS },
		GetMemoryInfo_v2Func:    func() (nvml.Memory_v2, nvml.Return) { return nvml.Memory_v2{Used: used}, nvml.SUCCESS },
	}
}

type fixedThreshold int32

func (f fixedThreshold) Threshold(string, string) int32 { return int32(f) }

// harness is a sampler on fake NVML with its metrics and the claims it
// told of changes.
type harness struct {
	s       *Sampler
	reg     *prometheus.Registry
	changed []types.UID
	t0      time.Time
}

func newHarness(t *testing.T, lib *fakeNVML, procRoot string, th Thresholds) *harness {
	t.Helper()
	h := &harness{reg: prometheus.NewRegistry(), t0: time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)}
	h.s = New(Options{NVML: lib, ProcRoot: procRoot, Interval: 10 * time.Second, Window: 30 * time.Second,
		Thresholds: th, Metrics: NewMetrics(h.reg), Changed: func(uid types.UID) { h.changed = append(h.changed, uid) }})
	return h
}

// at samples at t0 + d.
func (h *harness) at(d time.Duration) { h.s.Sample(context.Background(), h.t0.Add(d)) }

// passes samples every 10 s from from to to, inclusive.
func (h *harness) passes(from, to time.Duration) {
	for d := from; d <= to; d += 10 * time.Second {
		h.at(d)
	}
}

func record(uid, name, gpuUUID string, devs ...checkpoint.Device) *checkpoint.Claim {
	for i := range devs {
		if devs[i].GPUUUID == "" {
			devs[i].GPUUUID = gpuUUID
		}
	}
	return &checkpoint.Claim{UID: uid, Namespace: "team-a", Name: name, State: checkpoint.PrepareCompleted, Devices: devs,
		Pods: []checkpoint.Pod{{UID: uid + "-pod", Name: name + "-pod"}}}
}

func wantCondition(t *testing.T, s *Sampler, uid types.UID, device string, status metav1.ConditionStatus, reason string) Condition {
	t.Helper()
	c, ok := s.Condition(uid, device, "")
	if !ok {
		t.Fatalf("no Idle condition for %s %s", uid, device)
	}
	if c.Status != status || c.Reason != reason {
		t.Fatalf("Idle of %s %s = %s/%s (%s), want %s/%s", uid, device, c.Status, c.Reason, c.Message, status, reason)
	}
	return c
}

func TestWholeGPUIdleSinceFirstIdleWindowWrittenOnlyOnChange(t *testing.T) {
	util := uint32(0)
	g := &mock.Device{
		GetUtilizationRatesFunc: func() (nvml.Utilization, nvml.Return) { return nvml.Utilization{Gpu: util}, nvml.SUCCESS },
		GetMemoryInfo_v2Func:    func() (nvml.Memory_v2, nvml.Return) { return nvml.Memory_v2{Used: 1 << 30}, nvml.SUCCESS },
	}
	h := newHarness(t, &fakeNVML{devices: map[string]nvml.Device{"GPU-0": g}}, t.TempDir(), nil)
	h.s.Track(record("c1", "notebook", "GPU-0", checkpoint.Device{Device: "gpu-0", DeviceClass: "h100"}), h.t0)
	wantCondition(t, h.s, "c1", "gpu-0", metav1.ConditionUnknown, gpuaasv1.ReasonIdleNoSamples)

	h.passes(0, 20*time.Second) // the first window, not yet closed
	wantCondition(t, h.s, "c1", "gpu-0", metav1.ConditionUnknown, gpuaasv1.ReasonIdleNoSamples)
	h.passes(30*time.Second, 120*time.Second) // closes four idle windows
	c := wantCondition(t, h.s, "c1", "gpu-0", metav1.ConditionTrue, gpuaasv1.ReasonIdleBelowThreshold)
	if !c.Since.Equal(h.t0) {
		t.Errorf("idle since %s, want the start of the first idle window %s", c.Since, h.t0)
	}
	if len(h.changed) != 1 {
		t.Errorf("status writes asked %d times over four idle windows, want 1 (only on change)", len(h.changed))
	}
	labels := prometheus.Labels{"namespace": "team-a", "pod": "notebook-pod", "claim": "notebook", "device": "gpu-0", "profile": "h100", "tenant": ""}
	m := h.s.opts.Metrics
	if got := testutil.ToFloat64(m.idleSeconds.With(labels)); got != 120 {
		t.Errorf("idle seconds = %v, want 120 (four closed idle windows of 30 s)", got)
	}
	if got := testutil.ToFloat64(m.memory.With(labels)); got != 1<<30 {
		t.Errorf("memory used = %v, want %v", got, 1<<30)
	}

	util = 60
	h.passes(130*time.Second, 150*time.Second)
	wantCondition(t, h.s, "c1", "gpu-0", metav1.ConditionFalse, gpuaasv1.ReasonIdleInUse)
	if len(h.changed) != 2 {
		t.Errorf("status writes asked %d times, want 2 (idle, then in use)", len(h.changed))
	}
	if got := testutil.ToFloat64(m.utilization.With(labels)); got != 60 {
		t.Errorf("utilization = %v, want 60", got)
	}
}

func TestThresholdOfTheClaim(t *testing.T) {
	h := newHarness(t, &fakeNVML{devices: map[string]nvml.Device{"GPU-0": gpu(4, 0)}}, t.TempDir(), fixedThreshold(5))
	h.s.Track(record("c1", "low", "GPU-0", checkpoint.Device{Device: "gpu-0"}), h.t0)
	h.passes(0, 30*time.Second)
	wantCondition(t, h.s, "c1", "gpu-0", metav1.ConditionTrue, gpuaasv1.ReasonIdleBelowThreshold)

	h = newHarness(t, &fakeNVML{devices: map[string]nvml.Device{"GPU-0": gpu(4, 0)}}, t.TempDir(), nil)
	h.s.Track(record("c1", "low", "GPU-0", checkpoint.Device{Device: "gpu-0"}), h.t0)
	h.passes(0, 30*time.Second)
	wantCondition(t, h.s, "c1", "gpu-0", metav1.ConditionFalse, gpuaasv1.ReasonIdleInUse)
}

// tenantsOf is a Tenants of a fixed map.
type tenantsOf map[string]string

func (t tenantsOf) Tenant(namespace string) string { return t[namespace] }

// The use series carry the claim's tenant, so that dashboards sum use by
// tenant as they sum quota; a namespace that moves to another tenant
// leaves no series under the old one (summed twice otherwise).
func TestUseLabelledByTenant(t *testing.T) {
	tenants := tenantsOf{"team-a": "acme"}
	h := newHarness(t, &fakeNVML{devices: map[string]nvml.Device{"GPU-0": gpu(40, 1<<20)}}, t.TempDir(), nil)
	h.s.opts.Tenants = tenants
	h.s.Track(record("c1", "trainer", "GPU-0", checkpoint.Device{Device: "gpu-0", DeviceClass: "h100"}), h.t0)
	h.passes(0, 30*time.Second)
	m := h.s.opts.Metrics
	acme := prometheus.Labels{"namespace": "team-a", "pod": "trainer-pod", "claim": "trainer", "device": "gpu-0", "profile": "h100", "tenant": "acme"}
	if got := testutil.ToFloat64(m.utilization.With(acme)); got != 40 {
		t.Errorf("utilization of tenant acme = %v, want 40", got)
	}

	tenants["team-a"] = "umbrella"
	h.passes(40*time.Second, 60*time.Second)
	umbrella := withPod(acme, "trainer-pod")
	umbrella["tenant"] = "umbrella"
	if got := testutil.ToFloat64(m.utilization.With(umbrella)); got != 40 {
		t.Errorf("utilization of tenant umbrella = %v, want 40", got)
	}
	for name, v := range map[string]prometheus.Collector{"utilization": m.utilization, "memory": m.memory, "use_known": m.known, "idle_seconds": m.idleSeconds} {
		if n := testutil.CollectAndCount(v); n != 1 {
			t.Errorf("%s has %d series after the tenant changed, want 1 (none under the old tenant)", name, n)
		}
	}
}

// A restarted plugin has not seen the past: a device idle before starts
// Unknown/NoSamples again.
func TestRestartStartsUnknown(t *testing.T) {
	lib := &fakeNVML{devices: map[string]nvml.Device{"GPU-0": gpu(0, 0)}}
	rec := record("c1", "notebook", "GPU-0", checkpoint.Device{Device: "gpu-0"})
	h := newHarness(t, lib, t.TempDir(), nil)
	h.s.Track(rec, h.t0)
	h.passes(0, 60*time.Second)
	wantCondition(t, h.s, "c1", "gpu-0", metav1.ConditionTrue, gpuaasv1.ReasonIdleBelowThreshold)

	restarted := newHarness(t, lib, t.TempDir(), nil)
	restarted.s.Track(rec, h.t0.Add(70*time.Second))
	c := wantCondition(t, restarted.s, "c1", "gpu-0", metav1.ConditionUnknown, gpuaasv1.ReasonIdleNoSamples)
	if !c.Since.Equal(h.t0.Add(70 * time.Second)) {
		t.Errorf("Unknown since %s, want the restart %s", c.Since, h.t0.Add(70*time.Second))
	}
}

// A plugin that tracks its claims within the second it started (its use
// Lease's acquireTime, in microseconds) reports an idleness no older than
// its first sample: the condition's lastTransitionTime (whole seconds) is
// rounded up, not down to before the process existed, which the
// controller refuses for as long as the claim stays idle (issue 56: a
// restarted plugin's idle claim never evicted).
func TestIdleSinceNotBeforeTrackingBegan(t *testing.T) {
	lib := &fakeNVML{devices: map[string]nvml.Device{"GPU-0": gpu(0, 0)}}
	h := newHarness(t, lib, t.TempDir(), nil)
	began := h.t0.Add(900 * time.Millisecond)
	h.s.Track(record("c1", "notebook", "GPU-0", checkpoint.Device{Device: "gpu-0"}), began)
	for d := 900 * time.Millisecond; d <= 60*time.Second; d += 10 * time.Second {
		h.at(d)
	}
	c := wantCondition(t, h.s, "c1", "gpu-0", metav1.ConditionTrue, gpuaasv1.ReasonIdleBelowThreshold)
	if c.Since.Before(began) {
		t.Errorf("idle since %s, before the sampler began tracking the claim at %s", c.Since.Format(time.RFC3339Nano), began.Format(time.RFC3339Nano))
	}
	if c.Since.Truncate(time.Second) != c.Since {
		t.Errorf("idle since %s: not whole seconds, as a condition's lastTransitionTime holds it", c.Since.Format(time.RFC3339Nano))
	}
}

// Use NVML cannot tell is unknown, never 0: not idle, no utilization
// series, use_known 0.
func TestUnknownIsNeverZero(t *testing.T) {
	notSupported := &mock.Device{
		GetUtilizationRatesFunc: func() (nvml.Utilization, nvml.Return) { return nvml.Utilization{}, nvml.ERROR_NOT_SUPPORTED },
		GetMemoryInfo_v2Func:    func() (nvml.Memory_v2, nvml.Return) { return nvml.Memory_v2{}, nvml.ERROR_NOT_SUPPORTED },
	}
	noGPM := &mock.Device{
		GpmQueryDeviceSupportFunc: func() (nvml.GpmSupport, nvml.Return) { return nvml.GpmSupport{IsSupportedDevice: 0}, nvml.SUCCESS },
	}
	migHandle := &mock.Device{GetMemoryInfoFunc: func() (nvml.Memory, nvml.Return) { return nvml.Memory{Used: 5}, nvml.SUCCESS }}
	lib := &fakeNVML{devices: map[string]nvml.Device{"GPU-ns": notSupported, "GPU-a100": noGPM, "MIG-1": migHandle}}
	h := newHarness(t, lib, t.TempDir(), nil)
	h.s.Track(record("ns", "whole", "GPU-ns", checkpoint.Device{Device: "gpu-0"}), h.t0)
	h.s.Track(record("mig", "mig", "GPU-a100", checkpoint.Device{Device: "gpu-1-mig-1g.10gb-0", GPUMode: "dynamic",
		CreatedMIG: &mig.Instance{UUID: "MIG-1", GIID: 3}}), h.t0)
	h.s.Track(record("lost", "lost", "GPU-gone", checkpoint.Device{Device: "gpu-2"}), h.t0)
	h.passes(0, 90*time.Second)
	m := h.s.opts.Metrics
	for _, c := range []struct{ uid, name, device, why string }{
		{"ns", "whole", "gpu-0", "NOT_SUPPORTED"},
		{"mig", "mig", "gpu-1-mig-1g.10gb-0", "no GPM"},
		{"lost", "lost", "gpu-2", "cannot be read"},
	} {
		cond := wantCondition(t, h.s, types.UID(c.uid), c.device, metav1.ConditionUnknown, gpuaasv1.ReasonIdleUseUnknown)
		if !strings.Contains(cond.Message, c.why) {
			t.Errorf("%s: message %q does not say %q", c.name, cond.Message, c.why)
		}
		labels := prometheus.Labels{"namespace": "team-a", "pod": c.name + "-pod", "claim": c.name, "device": c.device, "profile": "", "tenant": ""}
		if got := testutil.ToFloat64(m.known.With(labels)); got != 0 {
			t.Errorf("%s: use_known = %v, want 0", c.name, got)
		}
		if got := testutil.ToFloat64(m.idleSeconds.With(labels)); got != 0 {
			t.Errorf("%s: idle seconds = %v, want 0", c.name, got)
		}
	}
	if n := testutil.CollectAndCount(m.utilization); n != 0 {
		t.Errorf("%d utilization series for devices of unknown use, want none (unknown is not 0)", n)
	}
}

func TestMIGDeviceMeasuredByGPM(t *testing.T) {
	var sampledGI []int
	parent := &mock.Device{
		GpmQueryDeviceSupportFunc: func() (nvml.GpmSupport, nvml.Return) { return nvml.GpmSupport{IsSupportedDevice: 1}, nvml.SUCCESS },
		GpmMigSampleGetFunc:       func(gi int, _ nvml.GpmSample) nvml.Return { sampledGI = append(sampledGI, gi); return nvml.SUCCESS },
	}
	migHandle := &mock.Device{GetMemoryInfoFunc: func() (nvml.Memory, nvml.Return) { return nvml.Memory{Used: 7 << 20}, nvml.SUCCESS }}
	lib := &fakeNVML{devices: map[string]nvml.Device{"GPU-h100": parent, "MIG-1": migHandle}, lib: &mock.Interface{
		GpmSampleAllocFunc: func() (nvml.GpmSample, nvml.Return) {
			return &mock.GpmSample{FreeFunc: func() nvml.Return { return nvml.SUCCESS }}, nvml.SUCCESS
		},
		GpmMetricsGetFunc: func(g *nvml.GpmMetricsGetType) nvml.Return {
			if g.NumMetrics != 1 || g.Metrics[0].MetricId != uint32(nvml.GPM_METRIC_SM_UTIL) || g.Sample1 == g.Sample2 {
				return nvml.ERROR_INVALID_ARGUMENT
			}
			g.Metrics[0].Value = 35
			return nvml.SUCCESS
		},
	}}
	h := newHarness(t, lib, t.TempDir(), nil)
	h.s.Track(record("c1", "trainer", "GPU-h100", checkpoint.Device{Device: "gpu-0-mig-3g.40gb-0", GPUMode: "dynamic",
		GPUShare: 3.0 / 7, CreatedMIG: &mig.Instance{UUID: "MIG-1", GIID: 2}}), h.t0)
	// The first GPM sample has nothing to compare with: the first window
	// is judged on the two after it.
	h.passes(0, 30*time.Second)
	wantCondition(t, h.s, "c1", "gpu-0-mig-3g.40gb-0", metav1.ConditionFalse, gpuaasv1.ReasonIdleInUse)
	if len(h.changed) != 1 {
		t.Errorf("%d status writes, want 1 (NoSamples to InUse, no UseUnknown between)", len(h.changed))
	}
	labels := prometheus.Labels{"namespace": "team-a", "pod": "trainer-pod", "claim": "trainer", "device": "gpu-0-mig-3g.40gb-0", "profile": "", "tenant": ""}
	m := h.s.opts.Metrics
	if got := testutil.ToFloat64(m.utilization.With(labels)); got != 35 {
		t.Errorf("utilization = %v, want 35 (GPM SM utilization)", got)
	}
	if got := testutil.ToFloat64(m.perUnit.With(labels)); got != 35 {
		t.Errorf("utilization per unit = %v, want 35 (the instance's: the claim holds all of it)", got)
	}
	if got := testutil.ToFloat64(m.memory.With(labels)); got != 7<<20 {
		t.Errorf("memory = %v, want the instance's %v", got, 7<<20)
	}
	for _, gi := range sampledGI {
		if gi != 2 {
			t.Fatalf("GPM sampled GPU instance %d, want 2", gi)
		}
	}
}

// Two claims time-slice one GPU: each process's use goes to the claim of
// its pod, through /proc/<pid>/cgroup.
func TestSharedGPUSplitByPod(t *testing.T) {
	busyPod, idlePod := types.UID("11111111-1111-1111-1111-111111111111"), types.UID("22222222-2222-2222-2222-222222222222")
	root := t.TempDir()
	fakeProc(t, root, map[uint32]types.UID{100: busyPod, 200: idlePod})
	ts := uint64(1000)
	var asked []uint64
	g := &mock.Device{
		GetProcessUtilizationFunc: func(lastSeen uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
			asked = append(asked, lastSeen)
			ts += 10
			return []nvml.ProcessUtilizationSample{{Pid: 100, TimeStamp: ts, SmUtil: 70}, {Pid: 200, TimeStamp: ts, SmUtil: 0}, {Pid: 999, TimeStamp: ts, SmUtil: 30}}, nvml.SUCCESS
		},
		GetComputeRunningProcessesFunc: func() ([]nvml.ProcessInfo, nvml.Return) {
			return []nvml.ProcessInfo{{Pid: 100, UsedGpuMemory: 3 << 30}, {Pid: 200, UsedGpuMemory: 1 << 30}}, nvml.SUCCESS
		},
		GetMPSComputeRunningProcessesFunc: func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.ERROR_NOT_SUPPORTED },
	}
	h := newHarness(t, &fakeNVML{devices: map[string]nvml.Device{"GPU-0": g}}, root, fixedThreshold(5))
	busy := record("busy", "trainer", "GPU-0", checkpoint.Device{Device: "gpu-0-ts-0", GPUMode: "timeSlicing/4", GPUShare: 0.25, DeviceClass: "ts"})
	busy.Pods = []checkpoint.Pod{{UID: string(busyPod), Name: "trainer-0"}}
	idle := record("idle", "notebook", "GPU-0", checkpoint.Device{Device: "gpu-0-ts-1", GPUMode: "timeSlicing/4", GPUShare: 0.25, DeviceClass: "ts"})
	idle.Pods = []checkpoint.Pod{{UID: string(idlePod), Name: "notebook-0"}}
	h.s.Track(busy, h.t0)
	h.s.Track(idle, h.t0)
	h.passes(0, 60*time.Second)
	wantCondition(t, h.s, "busy", "gpu-0-ts-0", metav1.ConditionFalse, gpuaasv1.ReasonIdleInUse)
	wantCondition(t, h.s, "idle", "gpu-0-ts-1", metav1.ConditionTrue, gpuaasv1.ReasonIdleBelowThreshold)
	m := h.s.opts.Metrics
	busyL := prometheus.Labels{"namespace": "team-a", "pod": "trainer-0", "claim": "trainer", "device": "gpu-0-ts-0", "profile": "ts", "tenant": ""}
	idleL := prometheus.Labels{"namespace": "team-a", "pod": "notebook-0", "claim": "notebook", "device": "gpu-0-ts-1", "profile": "ts", "tenant": ""}
	for _, c := range []struct {
		name string
		g    *prometheus.GaugeVec
		l    prometheus.Labels
		want float64
	}{
		{"busy utilization", m.utilization, busyL, 70},
		{"busy per unit", m.perUnit, busyL, 280},
		{"busy memory", m.memory, busyL, 3 << 30},
		{"idle utilization", m.utilization, idleL, 0},
		{"idle memory", m.memory, idleL, 1 << 30},
		{"idle known", m.known, idleL, 1},
	} {
		if got := testutil.ToFloat64(c.g.With(c.l)); got != c.want {
			t.Errorf("%s = %v, want %v", c.name, got, c.want)
		}
	}
	if asked[0] != 0 || asked[1] != 1010 {
		t.Errorf("GetProcessUtilization asked since %v, want 0 then the last sample's timestamp 1010", asked[:2])
	}

	h.s.Forget("idle")
	if n := testutil.CollectAndCount(m.known); n != 1 {
		t.Errorf("%d use_known series after the idle claim's unprepare, want 1 (the busy claim's)", n)
	}
}

// Where the per-process samples cannot be read, every claim on the shared
// GPU has unknown use, not 0.
func TestSharedGPUWithoutProcessSamplesIsUnknown(t *testing.T) {
	g := &mock.Device{
		GetProcessUtilizationFunc: func(uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
			return nil, nvml.ERROR_NOT_SUPPORTED
		},
		GetComputeRunningProcessesFunc:    func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.SUCCESS },
		GetMPSComputeRunningProcessesFunc: func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.SUCCESS },
	}
	h := newHarness(t, &fakeNVML{devices: map[string]nvml.Device{"GPU-0": g}}, t.TempDir(), nil)
	h.s.Track(record("c1", "mps", "GPU-0", checkpoint.Device{Device: "gpu-0-shared", GPUMode: "shared/MPS", Shared: true, ShareID: "s1"}), h.t0)
	h.passes(0, 30*time.Second)
	c, ok := h.s.Condition("c1", "gpu-0-shared", "s1")
	if !ok || c.Status != metav1.ConditionUnknown || c.Reason != gpuaasv1.ReasonIdleUseUnknown {
		t.Errorf("Idle = %+v, %v; want Unknown/UseUnknown", c, ok)
	}
}

// A binding without the call (a simulated machine without use state) makes
// the use unknown; the sampler goes on.
func TestMissingNVMLCallIsUnknown(t *testing.T) {
	h := newHarness(t, &fakeNVML{devices: map[string]nvml.Device{"GPU-0": &mock.Device{}}}, t.TempDir(), nil)
	h.s.Track(record("c1", "whole", "GPU-0", checkpoint.Device{Device: "gpu-0"}), h.t0)
	h.passes(0, 30*time.Second)
	wantCondition(t, h.s, "c1", "gpu-0", metav1.ConditionUnknown, gpuaasv1.ReasonIdleUseUnknown)
}

// Tracking, learning pods, reading conditions and forgetting go on while
// a pass samples (go test -race).
func TestSamplingWhileClaimsChange(t *testing.T) {
	root := t.TempDir()
	g := &mock.Device{
		GetProcessUtilizationFunc: func(uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
			return []nvml.ProcessUtilizationSample{{Pid: 1, TimeStamp: 1, SmUtil: 1}}, nvml.SUCCESS
		},
		GetComputeRunningProcessesFunc:    func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.SUCCESS },
		GetMPSComputeRunningProcessesFunc: func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.SUCCESS },
	}
	h := newHarness(t, &fakeNVML{devices: map[string]nvml.Device{"GPU-0": g}}, root, nil)
	for i := 0; i < 5; i++ {
		uid := fmt.Sprintf("c%d", i)
		h.s.Track(record(uid, uid, "GPU-0", checkpoint.Device{Device: "gpu-0-ts-" + uid, GPUMode: "timeSlicing/5"}), h.t0)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < 300; i++ {
			h.at(time.Duration(i) * 10 * time.Second)
		}
	}()
	for i := 0; ; i++ {
		select {
		case <-done:
			return
		default:
		}
		uid := fmt.Sprintf("c%d", i%5)
		h.s.Track(record(uid, uid, "GPU-0", checkpoint.Device{Device: "gpu-0-ts-" + uid, GPUMode: "timeSlicing/5"}), h.t0)
		h.s.SetPods(types.UID(uid), []checkpoint.Pod{{UID: fmt.Sprintf("pod-%d", i%50), Name: "p"}})
		h.s.Condition(types.UID(uid), "gpu-0-ts-"+uid, "")
		if i%7 == 0 {
			h.s.Forget(types.UID(uid))
		}
	}
}

// A shared claim of two pods has a series per pod; the claim's own series
// (pod "") from before its pods were known goes.
func TestSharedClaimOfTwoPods(t *testing.T) {
	podA, podB := types.UID("33333333-3333-3333-3333-333333333333"), types.UID("44444444-4444-4444-4444-444444444444")
	root := t.TempDir()
	fakeProc(t, root, map[uint32]types.UID{10: podA, 20: podB})
	ts := uint64(0)
	g := &mock.Device{
		GetProcessUtilizationFunc: func(uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
			ts++
			return []nvml.ProcessUtilizationSample{{Pid: 10, TimeStamp: ts, SmUtil: 30}, {Pid: 20, TimeStamp: ts, SmUtil: 10}}, nvml.SUCCESS
		},
		GetComputeRunningProcessesFunc:    func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.SUCCESS },
		GetMPSComputeRunningProcessesFunc: func() ([]nvml.ProcessInfo, nvml.Return) { return nil, nvml.SUCCESS },
	}
	h := newHarness(t, &fakeNVML{devices: map[string]nvml.Device{"GPU-0": g}}, root, nil)
	rec := record("c1", "serving", "GPU-0", checkpoint.Device{Device: "gpu-0-shared", GPUMode: "shared", Shared: true})
	rec.Pods = nil // an older record
	h.s.Track(rec, h.t0)
	h.at(0)
	m := h.s.opts.Metrics
	claimL := prometheus.Labels{"namespace": "team-a", "pod": "", "claim": "serving", "device": "gpu-0-shared", "profile": "", "tenant": ""}
	if got := testutil.ToFloat64(m.utilization.With(claimL)); got != 0 {
		t.Fatalf("utilization with no pod known = %v, want 0 (no process is the claim's)", got)
	}
	h.s.SetPods("c1", []checkpoint.Pod{{UID: string(podA), Name: "serving-a"}, {UID: string(podB), Name: "serving-b"}})
	h.at(10 * time.Second)
	for pod, want := range map[string]float64{"serving-a": 30, "serving-b": 10} {
		l := withPod(claimL, pod)
		if got := testutil.ToFloat64(m.utilization.With(l)); got != want {
			t.Errorf("utilization of pod %s = %v, want %v", pod, got, want)
		}
	}
	if n := testutil.CollectAndCount(m.utilization); n != 2 {
		t.Errorf("%d utilization series, want 2 (one per pod, none for the claim)", n)
	}
}

// A GPM sample that fails (a GPU released for maintenance and taken back)
// frees the device's buffers; the next pass allocates new ones and
// measures again.
func TestGPMBuffersRenewedAfterAFailedSample(t *testing.T) {
	fail := false
	allocs, frees := 0, 0
	parent := &mock.Device{
		GpmQueryDeviceSupportFunc: func() (nvml.GpmSupport, nvml.Return) { return nvml.GpmSupport{IsSupportedDevice: 1}, nvml.SUCCESS },
		GpmMigSampleGetFunc: func(int, nvml.GpmSample) nvml.Return {
			if fail {
				return nvml.ERROR_UNINITIALIZED
			}
			return nvml.SUCCESS
		},
	}
	lib := &fakeNVML{devices: map[string]nvml.Device{"GPU-h100": parent, "MIG-1": &mock.Device{
		GetMemoryInfoFunc: func() (nvml.Memory, nvml.Return) { return nvml.Memory{}, nvml.SUCCESS }}}, lib: &mock.Interface{
		GpmSampleAllocFunc: func() (nvml.GpmSample, nvml.Return) {
			allocs++
			return &mock.GpmSample{FreeFunc: func() nvml.Return { frees++; return nvml.SUCCESS }}, nvml.SUCCESS
		},
		GpmMetricsGetFunc: func(g *nvml.GpmMetricsGetType) nvml.Return { g.Metrics[0].Value = 50; return nvml.SUCCESS },
	}}
	h := newHarness(t, lib, t.TempDir(), nil)
	h.s.Track(record("c1", "trainer", "GPU-h100", checkpoint.Device{Device: "mig", GPUMode: "dynamic",
		CreatedMIG: &mig.Instance{UUID: "MIG-1", GIID: 1}}), h.t0)
	h.passes(0, 30*time.Second)
	fail = true
	h.passes(40*time.Second, 60*time.Second)
	wantCondition(t, h.s, "c1", "mig", metav1.ConditionUnknown, gpuaasv1.ReasonIdleUseUnknown)
	if frees != allocs {
		t.Fatalf("after failed samples: %d buffers allocated, %d freed; want every one freed", allocs, frees)
	}
	before := allocs
	fail = false
	h.passes(70*time.Second, 120*time.Second)
	wantCondition(t, h.s, "c1", "mig", metav1.ConditionFalse, gpuaasv1.ReasonIdleInUse)
	if allocs != before+2 {
		t.Errorf("%d buffers allocated after the failures, want 2 new ones", allocs-before)
	}
}
