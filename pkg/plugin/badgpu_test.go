package plugin

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/checkpoint"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/inventory"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/telemetry"

	"github.com/gpuaas/gpu-dra-driver/pkg/health"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev/nvmock"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/prepare/preparetest"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
)

// Issue 25 item 1: a GPU lost while a claim was prepared on it is reported
// by the restarted plugin: a Node event and the gpu_problems metric for the
// GPU NVML cannot read, a gpu-lost fault for the GPU the claim's record
// names, and that fault as the prepared device's health (the kubelet's
// device health, which it shows in the pod's status) although the device
// is no longer published. The GPUs that are readable are published.
func TestLostGPUIsReportedWithItsPreparedClaims(t *testing.T) {
	e := newTestEnvIn(t, "dgxh100", preparetest.DynamicAll(), t.TempDir())
	dev := e.PartitionAt(t, 2, "2g.20gb", 2)
	lostUUID := dev.GPU.UUID
	claim := preparetest.NewClaim("m").Device("mig", dev.Name()).Build()
	if _, err := e.state.Prepare(e.Ctx, claim); err != nil {
		t.Fatal(err)
	}
	if err := nvmock.SetGPULost(e.MockStateDir, "2", true); err != nil {
		t.Fatal(err)
	}

	e.ReopenMachine(t, preparetest.DynamicAll())
	e.state = restartWith(t, e, claim)
	monitor := health.New(e.Lib, health.Config{ProbeInterval: 20 * time.Millisecond}, nil)
	d, pub := testDriver(t, e, preparetest.DynamicAll())
	ctx := watchWithMonitor(t, e, d, monitor)

	store, err := checkpoint.NewStore(e.CkptDir)
	if err != nil {
		t.Fatal(err)
	}
	records, _, err := store.List()
	if err != nil {
		t.Fatal(err)
	}
	problems := inventory.FindGPUProblems(e.Lib, records)
	problems.Report(ctx, telemetry.NewNodeEvents(context.Background(), e.Events, nil, testNode), e.Metrics, monitor)
	d.orphans = problems.Orphans

	if got := e.Events.WithReason(inventory.ReasonGPUNotPublished); len(got) != 1 || !strings.Contains(got[0], "GPU 2 cannot be read") {
		t.Errorf("Node events %v, want one saying GPU 2 cannot be read", got)
	}
	if got := testutil.ToFloat64(e.Metrics.GPUProblems.WithLabelValues("2", "", "gpu-lost")); got != 1 {
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
	if err := e.state.Unprepare(e.Ctx, "m"); err != nil {
		t.Errorf("unpreparing the claim on the lost GPU: %v", err)
	}
}
