package plugin

import (
	"context"
	"fmt"
	"path/filepath"
	"reflect"
	"testing"

	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/cdi"
	"github.com/gpuaas/gpu-dra-driver/pkg/mig"
	"github.com/gpuaas/gpu-dra-driver/pkg/mps"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/checkpoint"
	"github.com/gpuaas/gpu-dra-driver/pkg/timeslice"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"
)

// Every kind a node publishes is torn down and counted, after a restart,
// as the kind its record names: the recorded mode reads back as the same
// kind.
func TestRecordedModeReadsBackAsItsKind(t *testing.T) {
	cfg := &configapi.NodeConfig{GPUs: []configapi.GpuModeSelector{
		{Indexes: []int{0}, GpuMode: configapi.GpuMode{MIG: configapi.MigDynamic}},
		{Indexes: []int{2}, GpuMode: configapi.GpuMode{TimeSlicing: &configapi.TimeSlicingMode{Replicas: 2, Strategy: configapi.MPSStrategy}}},
		{Indexes: []int{3}, GpuMode: configapi.GpuMode{TimeSlicing: &configapi.TimeSlicingMode{Replicas: 4, Interval: configapi.LongTimeSlice}}},
		{Indexes: []int{4}, GpuMode: configapi.GpuMode{Shared: &configapi.SharedMode{Strategy: configapi.MPSStrategy}}},
	}}
	e := newTestEnvWith(t, "dgxh100", cfg)
	seen := map[string]bool{}
	for _, d := range e.devices {
		rec := checkpoint.Device{GPUMode: d.kind.modeName()}
		if _, ok := d.kind.(dynamicMIG); ok {
			rec.CreatedMIG = &mig.Instance{}
		}
		if got := recordedKind(&rec); reflect.TypeOf(got) != reflect.TypeOf(d.kind) {
			t.Errorf("%s (%T, mode %q) reads back from its record as %T", d.Name(), d.kind, d.kind.modeName(), got)
		}
		seen[fmt.Sprintf("%T", d.kind)] = true
	}
	if len(seen) != 5 {
		t.Errorf("published kinds %v; want whole, dynamic MIG and whole, replica, share", seen)
	}
	if k := recordedKind(&checkpoint.Device{GPUMode: string(configapi.MigStatic)}); k != (staticMIG{}) {
		t.Errorf("static MIG record reads back as %T", k)
	}
}

// A record that names a MIG device the plugin made is torn down by
// destroying it, whatever mode it records (records of any version).
func TestRecordNamingAMIGDeviceIsDynamicMIG(t *testing.T) {
	for _, mode := range []string{"", "dynamic", "static", "timeSlicing/2"} {
		if k := recordedKind(&checkpoint.Device{GPUMode: mode, MIGIntent: &mig.Intent{}}); k != (dynamicMIG{}) {
			t.Errorf("record of mode %q with a MIG intent is a %T", mode, k)
		}
	}
}

// What each kind gives a container: its GPU's or MIG device's UUID, the
// GPU's minor, and an MPS client's daemon.
func TestKindCDIDevices(t *testing.T) {
	s := &State{migCaps: filepath.Join(t.TempDir(), "absent"), sharing: NewSharing(SharingOptions{MPSDir: "/mps"})}
	gpu := nvdev.GPU{UUID: "GPU-1", Minor: 3}
	inst := &mig.Instance{UUID: "MIG-1"}
	limits := &mps.Limits{MemoryBytes: 1 << 30, ThreadPercentage: 50}
	mpsShare := &sharingPlan{settings: timeslice.Settings{Strategy: configapi.MPSStrategy}, limits: limits}
	for name, tc := range map[string]struct {
		kind    deviceKind
		sharing *sharingPlan
		rec     checkpoint.Device
		want    cdi.Device
	}{
		"whole":         {kind: wholeGPU{}, want: cdi.Device{UUID: "GPU-1", Minor: 3}},
		"static MIG":    {kind: staticMIG{inst: inst}, want: cdi.Device{UUID: "MIG-1", Minor: 3}},
		"dynamic MIG":   {kind: dynamicMIG{}, rec: checkpoint.Device{CreatedMIG: inst}, want: cdi.Device{UUID: "MIG-1", Minor: 3}},
		"dynamic whole": {kind: dynamicWholeGPU{}, want: cdi.Device{UUID: "GPU-1", Minor: 3}},
		"time-sliced":   {kind: timeSliceReplica{}, sharing: &sharingPlan{}, want: cdi.Device{UUID: "GPU-1", Minor: 3}},
		"MPS replica": {kind: timeSliceReplica{}, sharing: mpsShare, want: cdi.Device{UUID: "GPU-1", Minor: 3,
			Env:    s.sharing.mps.ClientEnv("GPU-1", *limits),
			Mounts: []cdi.Mount{{HostPath: s.sharing.mps.PipeDir("GPU-1"), ContainerPath: s.sharing.mps.PipeDir("GPU-1")}, {HostPath: s.sharing.mps.ShmDir("GPU-1"), ContainerPath: mps.ShmContainerPath}}}},
	} {
		p := plannedDevice{device: &AllocatableDevice{GPU: gpu, API: resourceapi.Device{Name: "d"}, kind: tc.kind}, sharing: tc.sharing}
		got, err := tc.kind.cdiDevice(s, p, &tc.rec)
		tc.want.Name = "d"
		if err != nil || !equality.Semantic.DeepEqual(got, tc.want) {
			t.Errorf("%s: CDI device %+v, %v; want %+v", name, got, err, tc.want)
		}
	}
}

// Tearing a device down undoes what its kind's set-up recorded, and
// nothing else: a replica's hold on its GPU's settings is released, a
// static MIG device is left to the admin.
func TestKindTearDownReleasesWhatItHolds(t *testing.T) {
	e := newTestEnvWith(t, "dgxh100", sharingNode())
	withTools(t, e)
	ctx := context.Background()
	if _, err := e.state.Prepare(e.ctx, newClaim("a").device("gpu", "gpu-4-ts-0").build()); err != nil {
		t.Fatal(err)
	}
	rec, err := e.state.store.Load("a")
	if err != nil || rec == nil {
		t.Fatal(rec, err)
	}
	if err := (staticMIG{}).tearDown(ctx, e.state, rec, 0); err != nil {
		t.Fatal(err)
	}
	uuid := e.lib.GPUs()[4].UUID
	if n, _ := e.state.sharing.holders(uuid); n != 1 {
		t.Fatalf("%d holders after a static MIG teardown of the record; want the replica's 1", n)
	}
	if err := recordedKind(&rec.Devices[0]).tearDown(ctx, e.state, rec, 0); err != nil {
		t.Fatal(err)
	}
	if n, _ := e.state.sharing.holders(uuid); n != 0 {
		t.Errorf("%d holders after the replica's teardown; want 0", n)
	}
}
