package prepare

import (
	"context"
	"fmt"
	"reflect"
	"testing"

	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/mig"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/checkpoint"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/device"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/prepare/preparetest"
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
	for _, d := range e.Devices {
		rec := checkpoint.Device{GPUMode: d.Kind.ModeName()}
		if d.Partition() != nil {
			rec.CreatedMIG = &mig.Instance{}
		}
		if got := device.RecordedKind(&rec); reflect.TypeOf(got) != reflect.TypeOf(d.Kind) {
			t.Errorf("%s (%T, mode %q) reads back from its record as %T", d.Name(), d.Kind, d.Kind.ModeName(), got)
		}
		seen[fmt.Sprintf("%T", d.Kind)] = true
	}
	if len(seen) != 5 {
		t.Errorf("published kinds %v; want whole, dynamic MIG and whole, replica, share", seen)
	}
	if k := device.RecordedKind(&checkpoint.Device{GPUMode: string(configapi.MigStatic)}); k != device.StaticMIG(nil) {
		t.Errorf("static MIG record reads back as %T", k)
	}
}

// Tearing a device down undoes what its kind's set-up recorded, and
// nothing else: a replica's hold on its GPU's settings is released, a
// static MIG device is left to the admin.
func TestKindTearDownReleasesWhatItHolds(t *testing.T) {
	e := newTestEnvWith(t, "dgxh100", sharingNode())
	withTools(t, e)
	ctx := context.Background()
	if _, err := e.state.Prepare(e.Ctx, preparetest.NewClaim("a").Device("gpu", "gpu-4-ts-0").Build()); err != nil {
		t.Fatal(err)
	}
	rec, err := e.state.env.Store.Load("a")
	if err != nil || rec == nil {
		t.Fatal(rec, err)
	}
	if err := device.StaticMIG(nil).TearDown(ctx, &e.state.env, rec, 0); err != nil {
		t.Fatal(err)
	}
	uuid := e.Lib.GPUs()[4].UUID
	if n, _ := e.state.env.Sharing.Holders(uuid); n != 1 {
		t.Fatalf("%d holders after a static MIG teardown of the record; want the replica's 1", n)
	}
	if err := device.RecordedKind(&rec.Devices[0]).TearDown(ctx, &e.state.env, rec, 0); err != nil {
		t.Fatal(err)
	}
	if n, _ := e.state.env.Sharing.Holders(uuid); n != 0 {
		t.Errorf("%d holders after the replica's teardown; want 0", n)
	}
}
