package prepare

import (
	"os"
	"testing"

	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/atomicfile"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/prepare/preparetest"
	"k8s.io/apimachinery/pkg/types"
)

// TestPrepareMakesOneDurableWrite pins what must survive a power loss and
// nothing more: a prepare makes exactly one durable write (the completed
// record: file and directory synced), whatever the device kind; the staged
// records of a prepare under way and the CDI spec are not synced (their
// content does not outlive a reboot, see checkpoint.Store.Stage); an
// unprepare syncs the record's removal. Fewer would lose a prepared claim
// in a power loss; more is the cost the issue measured (4 fsyncs per
// whole-GPU prepare, 10 per dynamic-MIG prepare).
func TestPrepareMakesOneDurableWrite(t *testing.T) {
	cfg := &configapi.NodeConfig{GPUs: []configapi.GpuModeSelector{
		{Indexes: []int{0}, GpuMode: configapi.GpuMode{MIG: configapi.MigDynamic}},
		{Indexes: []int{1}, GpuMode: configapi.GpuMode{TimeSlicing: &configapi.TimeSlicingMode{Replicas: 2}}},
	}}
	e := newTestEnvWith(t, "dgxh100", cfg)
	if err := os.WriteFile(e.MigMinors, []byte(preparetest.MinorsFile(8)), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, device := range []string{"gpu-3", "gpu-1-ts-0", e.Partition(t, 0, "1g.10gb")} {
		uid := "claim-" + device
		before := atomicfile.Syncs()
		if _, err := e.state.Prepare(e.Ctx, preparetest.NewClaim(uid).Device("gpu", device).Build()); err != nil {
			t.Fatalf("%s: %v", device, err)
		}
		prepared := atomicfile.Syncs()
		if err := e.state.Unprepare(e.Ctx, types.UID(uid)); err != nil {
			t.Fatalf("%s: %v", device, err)
		}
		if got := prepared - before; got != 2 {
			t.Errorf("%s: prepare made %d fsyncs, want 2 (the completed record and its directory)", device, got)
		}
		if got := atomicfile.Syncs() - prepared; got != 1 {
			t.Errorf("%s: unprepare made %d fsyncs, want 1 (the record's removal)", device, got)
		}
	}
}
