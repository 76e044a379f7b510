package prepare

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/prepare/preparetest"
)

// A claim whose GPU another holder never lets go of (a hung NVML call, a
// wedged old pod) is answered with who holds the GPU since when, within
// the lock bound, instead of waiting past the kubelet's deadline.
func TestPrepareOfABusyGPUFailsNamingTheHolder(t *testing.T) {
	for name, otherProcess := range map[string]bool{"this process": false, "the other instance": true} {
		t.Run(name, func(t *testing.T) {
			e := newTestEnv(t, "dgxh100")
			e.state.locks.wait = 50 * time.Millisecond
			holder := e.state.locks
			if otherProcess {
				holder = newGPULocks(e.state.locks.dir)
			}
			if _, err := holder.lock(e.Ctx, "claim stuck", []string{e.GPUUUID(2)}); err != nil {
				t.Fatal(err)
			} // never unlocked
			_, err := e.state.Prepare(e.Ctx, preparetest.NewClaim("next").Device("gpu", "gpu-2").Build())
			if err == nil || !strings.Contains(err.Error(), "GPU 2 busy: held by claim stuck") || !strings.Contains(err.Error(), " since ") {
				t.Fatalf("prepare on a GPU held forever: err = %v", err)
			}
			if err := e.state.Unprepare(e.Ctx, "next"); err != nil {
				t.Errorf("unprepare of the refused claim: %v", err)
			}
		})
	}
}

// The start pins GPU modes from records read under the GPUs' locks: while
// the other instance of a rolling update holds a GPU mid-prepare, the read
// waits (here until its context ends, with who holds the GPU) rather than
// read around the prepare.
func TestStartReadsRecordsUnderTheGPUsLocks(t *testing.T) {
	e := newTestEnv(t, "dgxh100")
	other := newGPULocks(e.state.locks.dir)
	held, err := other.lock(e.Ctx, "claim mid-prepare", []string{e.GPUUUID(5)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(e.Ctx, 50*time.Millisecond)
	defer cancel()
	gpus := []string{e.GPUUUID(4), e.GPUUUID(5)}
	if _, err := RecordsUnderLocks(ctx, e.state.locks.dir, gpus, e.state.env.Store); err == nil || !strings.Contains(err.Error(), "busy: held by claim mid-prepare") {
		t.Fatalf("records read while the other instance holds GPU 5: err = %v", err)
	}
	if _, err := e.state.Prepare(e.Ctx, preparetest.NewClaim("done").Device("gpu", "gpu-4").Build()); err != nil {
		t.Fatal(err)
	}
	held.unlock()
	records, err := RecordsUnderLocks(e.Ctx, e.state.locks.dir, gpus, e.state.env.Store)
	if err != nil || len(records) != 1 || records[0].UID != "done" {
		t.Errorf("records once the GPU is free: %v, %v", records, err)
	}
}
