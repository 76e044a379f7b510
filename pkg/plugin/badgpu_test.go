package plugin

import (
	"strings"
	"testing"
	"time"

	"github.com/gpuaas/gpu-dra-driver/pkg/health"
	"github.com/prometheus/client_golang/prometheus/testutil"
	v1 "k8s.io/api/core/v1"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev/nvmock"
)

// Issue 25 item 1: a GPU that fell off the bus while claims were prepared
// on it used to make the next plugin process exit at enumeration, so those
// claims could never be unprepared (pods stuck Terminating). Now the
// restarted plugin comes up without that GPU and unprepares its claims:
// the dynamic MIG claim on it, whose MIG device
// cannot be destroyed while the GPU is lost (a reset destroys it).
func TestClaimsOnALostGPUAreUnpreparedAfterARestart(t *testing.T) {
	e := newTestEnvIn(t, "dgxh100", dynamicAll(), t.TempDir())
	mig := newClaim("m").device("mig", e.partitionAt(t, 2, "2g.20gb", 2).Name()).build()
	other := newClaim("o").device("gpu", e.partitionAt(t, 4, "1g.10gb", 0).Name()).build()
	for _, claim := range []*resourceapi.ResourceClaim{mig, other} {
		if _, err := e.state.Prepare(e.ctx, claim); err != nil {
			t.Fatal(err)
		}
	}
	if err := nvmock.SetGPULost(e.mockStateDir, "2", true); err != nil {
		t.Fatal(err)
	}

	e.reopenMachine(t, dynamicAll())
	for _, g := range e.lib.GPUs() {
		if g.Index == 2 {
			t.Fatalf("the lost GPU is enumerated: %+v", g)
		}
	}
	if p := e.lib.Problems(); len(p) != 1 || !p[0].Lost {
		t.Fatalf("problems %v, want GPU 2 lost", p)
	}
	s := restartWith(t, e, mig, other)
	for _, uid := range []string{"m", "o"} {
		if err := s.Unprepare(e.ctx, types.UID(uid)); err != nil {
			t.Errorf("unpreparing %s: %v", uid, err)
		}
		if e.recordExists(uid) || e.cdiSpecExists(uid) {
			t.Errorf("claim %s still recorded (%v) or its CDI spec left (%v)", uid, e.recordExists(uid), e.cdiSpecExists(uid))
		}
	}
}

// Issue 25 item 1: a GPU lost while a claim was prepared on it is reported
// by the restarted plugin: a Node event and the gpu_problems metric for the
// GPU NVML cannot read, a gpu-lost fault for the GPU the claim's record
// names, and that fault as the prepared device's health (the kubelet's
// device health, which it shows in the pod's status) although the device
// is no longer published. The GPUs that are readable are published.
func TestLostGPUIsReportedWithItsPreparedClaims(t *testing.T) {
	e := newTestEnvIn(t, "dgxh100", dynamicAll(), t.TempDir())
	dev := e.partitionAt(t, 2, "2g.20gb", 2)
	lostUUID := dev.GPU.UUID
	claim := newClaim("m").device("mig", dev.Name()).build()
	if _, err := e.state.Prepare(e.ctx, claim); err != nil {
		t.Fatal(err)
	}
	if err := nvmock.SetGPULost(e.mockStateDir, "2", true); err != nil {
		t.Fatal(err)
	}

	e.reopenMachine(t, dynamicAll())
	e.state = restartWith(t, e, claim)
	monitor := health.New(e.lib, health.Config{ProbeInterval: 20 * time.Millisecond}, nil)
	d, pub := testDriver(t, e, dynamicAll())
	ctx := watchWithMonitor(t, e, d, monitor)

	records, _, err := e.state.store.List()
	if err != nil {
		t.Fatal(err)
	}
	problems := findGPUProblems(e.lib, records)
	problems.report(ctx, nodeEvents{recorder: e.events, node: &v1.ObjectReference{Kind: "Node", Name: testNode}}, e.metrics, monitor)
	d.orphans = problems.orphans

	if got := e.events.withReason(ReasonGPUNotPublished); len(got) != 1 || !strings.Contains(got[0], "GPU 2 cannot be read") {
		t.Errorf("Node events %v, want one saying GPU 2 cannot be read", got)
	}
	if got := testutil.ToFloat64(e.metrics.gpuProblems.WithLabelValues("2", "", "gpu-lost")); got != 1 {
		t.Errorf("gpu_problems{index=2,reason=gpu-lost} = %v, want 1", got)
	}
	var lostFault bool
	for _, f := range monitor.Faults() {
		lostFault = lostFault || f.GPU == lostUUID && f.Kind == health.KindGPULost
	}
	if !lostFault {
		t.Errorf("no gpu-lost fault for %s: %v", lostUUID, monitor.Faults())
	}

	if err := d.publish(ctx); err != nil {
		t.Fatal(err)
	}
	gpus := map[string]bool{}
	for _, s := range pub.last(t).Slices {
		for _, dv := range s.Devices {
			if uuid := dv.Attributes["uuid"].StringValue; uuid != nil && dv.Attributes["type"].StringValue != nil && *dv.Attributes["type"].StringValue == "gpu" {
				gpus[*uuid] = true
			}
		}
	}
	if len(gpus) != 7 || gpus[lostUUID] {
		t.Errorf("published GPUs %v, want the 7 readable ones", gpus)
	}

	reports := make(chan kubeletplugin.DeviceHealthReport, 1)
	go func() { _ = d.WatchHealthStatus(ctx, reports) }()
	var found bool
	for _, dh := range (<-reports).Devices {
		if dh.DeviceName == dev.Name() {
			found = true
			if dh.Health != kubeletplugin.HealthStatusUnhealthy || !strings.Contains(dh.Message, "gpu-lost") {
				t.Errorf("prepared device on the lost GPU: %s (%s), want unhealthy, gpu-lost", dh.Health, dh.Message)
			}
		}
	}
	if !found {
		t.Errorf("no health reported for %s, prepared on the lost GPU", dev.Name())
	}
	if err := e.state.Unprepare(e.ctx, "m"); err != nil {
		t.Errorf("unpreparing the claim on the lost GPU: %v", err)
	}
}

// The same for a time-slice replica and a whole GPU: their teardown asks
// the GPU nothing that a lost GPU must answer.
func TestReplicaAndWholeClaimsOnALostGPUAreUnprepared(t *testing.T) {
	e := newTestEnvIn(t, "dgxh100", everyMode(), t.TempDir())
	var replica, whole string
	for _, d := range e.devices {
		switch {
		case d.GPU.Index == 1 && d.Type() == TypeTimeSlice && replica == "":
			replica = d.Name()
		case d.GPU.Index == 1 && d.Type() == TypeGPU:
			t.Fatalf("GPU 1 offered whole too: %s", d.Name())
		case d.GPU.Index == 3 && d.Type() == TypeGPU:
			whole = d.Name()
		}
	}
	claims := []*resourceapi.ResourceClaim{
		newClaim("r").device("gpu", replica).build(),
		newClaim("w").device("gpu", whole).build(),
	}
	for _, c := range claims {
		if _, err := e.state.Prepare(e.ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	for _, gpu := range []string{"1", "3"} {
		if err := nvmock.SetGPULost(e.mockStateDir, gpu, true); err != nil {
			t.Fatal(err)
		}
	}
	e.reopenMachine(t, everyMode())
	s := restartWith(t, e, claims...)
	for _, uid := range []string{"r", "w"} {
		if err := s.Unprepare(e.ctx, types.UID(uid)); err != nil {
			t.Errorf("unpreparing %s: %v", uid, err)
		}
		if e.recordExists(uid) || e.cdiSpecExists(uid) {
			t.Errorf("claim %s still recorded or its CDI spec left", uid)
		}
	}
}
