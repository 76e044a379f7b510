package prepare

import (
	"strings"
	"testing"

	"k8s.io/klog/v2/ktesting"

	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/inventory"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/prepare/preparetest"
)

// The rollout race of a node-config change: the old plugin instance still
// offers GPU 3 whole and prepares it for one claim, while the new one
// already publishes GPU 3 as replicas and is asked for one. Device names
// differ, the GPU is the same: the new instance refuses the replica.
func TestRolloutRaceOneGPUOneOwner(t *testing.T) {
	e := newTestEnvWith(t, "dgxh100", &configapi.NodeConfig{})
	old := e.state
	e.Devices = inventory.Discover(ktesting.NewLogger(t, ktesting.NewConfig()), e.Lib, &configapi.NodeConfig{GPUs: []configapi.GpuModeSelector{
		{Indexes: []int{3}, GpuMode: configapi.GpuMode{TimeSlicing: &configapi.TimeSlicingMode{Replicas: 4}}},
	}}).Devices
	replicas := e.newState(t)
	if _, err := old.Prepare(e.Ctx, preparetest.NewClaim("whole").Device("gpu", "gpu-3").Build()); err != nil {
		t.Fatal(err)
	}
	_, err := replicas.Prepare(e.Ctx, preparetest.NewClaim("replica").Device("gpu", "gpu-3-ts-0").Build())
	if err == nil || !strings.Contains(err.Error(), "GPU 3 is held by claim team-a/claim-whole (whole) as device gpu-3 (whole GPU); device gpu-3-ts-0 (timeSlicing/4) of this claim is another mode of it") {
		t.Fatalf("replica of a GPU held whole: err = %v", err)
	}
	if e.CDISpecExists("replica") || e.RecordExists("replica") {
		t.Error("the refused claim left a spec or record")
	}
}

// A replacement claim (a force-deleted pod's successor) prepared while the
// old claim's record still holds the GPU, in another mode, is refused
// until the old one is unprepared; then it is prepared.
func TestReplacementClaimWaitsForTheOldRecord(t *testing.T) {
	e := newTestEnvWith(t, "dgxh100", &configapi.NodeConfig{})
	if _, err := e.state.Prepare(e.Ctx, preparetest.NewClaim("old").Device("gpu", "gpu-3").Build()); err != nil {
		t.Fatal(err)
	}
	e.Devices = inventory.Discover(ktesting.NewLogger(t, ktesting.NewConfig()), e.Lib, &configapi.NodeConfig{GPUs: []configapi.GpuModeSelector{
		{Indexes: []int{3}, GpuMode: configapi.GpuMode{Shared: &configapi.SharedMode{}}},
	}}).Devices
	restarted := e.newState(t)
	replacement := shareOf("gpu-3-shared", "new", "1Gi").Build()
	if _, err := restarted.Prepare(e.Ctx, replacement); err == nil || !strings.Contains(err.Error(), "GPU 3 is held by claim team-a/claim-old (old) as device gpu-3 (whole GPU); device gpu-3-shared (shared) of this claim") {
		t.Fatalf("share of a GPU the old claim's record holds whole: err = %v", err)
	}
	if err := restarted.Unprepare(e.Ctx, "old"); err != nil {
		t.Fatal(err)
	}
	if _, err := restarted.Prepare(e.Ctx, replacement); err != nil {
		t.Fatalf("after the old claim was unprepared: %v", err)
	}
}
