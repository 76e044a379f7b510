package device

import (
	"testing"
	"time"

	"github.com/gpuaas/gpu-dra-driver/pkg/mig"
)

// Issue 25 item 3: every wait inside a kubelet DRA call ends well before
// the kubelet gives up on the call (45 s), leaving room for the rest of
// the prepare; mpsReady was 60 s. Item 2: the wait for a GPU another
// process holds before switching its MIG mode too.
func TestWaitsFitTheKubeletsCallTimeout(t *testing.T) {
	const restOfPrepare = 10 * time.Second // MIG create, CDI write, checkpoint
	for name, wait := range map[string]time.Duration{"mpsReady": mpsReady, "MIG mode in use": mig.DefaultInUseRetry.Within} {
		if wait+restOfPrepare > kubeletDRATimeout {
			t.Errorf("%s (%s) + the rest of a prepare (%s) exceeds the kubelet's DRA call timeout (%s)",
				name, wait, restOfPrepare, kubeletDRATimeout)
		}
	}
}
