package prepare

import (
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
