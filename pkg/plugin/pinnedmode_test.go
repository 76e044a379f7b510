package plugin

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/prepare/preparetest"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/telemetry"
)

// A node-configuration change for a GPU that claims hold stays unapplied
// (the GPU keeps its mode, so they can be unprepared and its devices are
// not given out twice); the plugin says so at start, in a Node event and
// a metric per GPU, instead of only a log line; when its last claim is
// unprepared the configured mode applies: its devices are those of the
// new mode, and the metric and a Normal event say so.
func TestBusyGPUsModeChangeIsReported(t *testing.T) {
	e := newTestEnv(t, "dgxh100")
	claim := preparetest.NewClaim("busy").Device("gpu", "gpu-1").Build()
	if _, err := e.state.Prepare(e.Ctx, claim); err != nil {
		t.Fatal(err)
	}
	uuid := e.Lib.GPUs()[1].UUID
	changed := &configapi.NodeConfig{GPUs: []configapi.GpuModeSelector{{Indexes: []int{1}, GpuMode: configapi.GpuMode{
		TimeSlicing: &configapi.TimeSlicingMode{Replicas: 2}}}}}
	e.Metrics = telemetry.NewMetrics(prometheus.NewRegistry())
	ctx, cancel := context.WithCancel(e.Ctx)
	defer cancel()
	d, err := Start(ctx, Options{NodeName: testNode, KubeClient: fake.NewClientset(claim), NVML: e.Lib, CDI: e.NewCDIHandler(t), NodeConfig: changed, Events: e.Events,
		PluginDataDir: filepath.Dir(e.CkptDir), RegistrarDir: t.TempDir(), Metrics: e.Metrics, BootIDPath: e.BootID})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Stop()
	if _, ok := d.state.DeviceMap()["gpu-1"]; !ok {
		t.Fatal("busy GPU 1 lost its whole device gpu-1")
	}
	warned := e.Events.WithReason(telemetry.ReasonModeChangeDeferred)
	if len(warned) != 1 || !strings.Contains(warned[0], uuid) || !strings.Contains(warned[0], "timeSlicing/2") {
		t.Errorf("Node events %s: %q; want one naming GPU %s and its configured mode timeSlicing/2", telemetry.ReasonModeChangeDeferred, warned, uuid)
	}
	if got := testutil.ToFloat64(e.Metrics.ModeChangesDeferred.WithLabelValues(uuid, "timeSlicing/2")); got != 1 {
		t.Errorf("gpuaas_dra_plugin_gpu_mode_change_deferred{gpu=%s} = %v, want 1", uuid, got)
	}
	// Every other GPU has its series at 0: a dashboard shows "none
	// deferred" as a value (TestRealNodePrometheus evaluates its panel).
	if n, want := testutil.CollectAndCount(e.Metrics.ModeChangesDeferred), len(e.Lib.GPUs()); n != want {
		t.Errorf("%d gpuaas_dra_plugin_gpu_mode_change_deferred series, want one per GPU (%d)", n, want)
	}
	other := e.Lib.GPUs()[0].UUID
	if got := testutil.ToFloat64(e.Metrics.ModeChangesDeferred.WithLabelValues(other, "whole")); got != 0 {
		t.Errorf("gpuaas_dra_plugin_gpu_mode_change_deferred{gpu=%s} (not busy, whole) = %v, want 0", other, got)
	}

	results, err := d.UnprepareResourceClaims(ctx, []kubeletplugin.NamespacedObject{{UID: claim.UID,
		NamespacedName: types.NamespacedName{Namespace: claim.Namespace, Name: claim.Name}}})
	if err != nil || results[claim.UID] != nil {
		t.Fatalf("unprepare: %v, %v", err, results[claim.UID])
	}
	devices := d.state.DeviceMap()
	if _, whole := devices["gpu-1"]; whole || devices["gpu-1-ts-0"] == nil || devices["gpu-1-ts-1"] == nil {
		t.Errorf("GPU 1 idle: devices gpu-1 %v, gpu-1-ts-0 %v, gpu-1-ts-1 %v; want its two replicas, not the whole GPU",
			whole, devices["gpu-1-ts-0"] != nil, devices["gpu-1-ts-1"] != nil)
	}
	if got := testutil.ToFloat64(e.Metrics.ModeChangesDeferred.WithLabelValues(uuid, "timeSlicing/2")); got != 0 {
		t.Errorf("gpuaas_dra_plugin_gpu_mode_change_deferred{gpu=%s} = %v after its last claim, want 0", uuid, got)
	}
	if n, want := testutil.CollectAndCount(e.Metrics.ModeChangesDeferred), len(e.Lib.GPUs()); n != want {
		t.Errorf("%d gpuaas_dra_plugin_gpu_mode_change_deferred series after GPU 1's last claim, want one per GPU (%d)", n, want)
	}
	if !e.Events.Saw("Normal", telemetry.ReasonModeChangeApplied) {
		t.Errorf("no Normal %s event: %q", telemetry.ReasonModeChangeApplied, e.Events.Events)
	}
}
