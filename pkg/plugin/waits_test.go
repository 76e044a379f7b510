package plugin

import (
	"testing"
	"time"
)

// Issue 25 item 3: every wait inside a kubelet DRA call ends well before
// the kubelet gives up on the call (45 s), leaving room for the rest of
// the prepare; mpsReady was 60 s.
func TestWaitsFitTheKubeletsCallTimeout(t *testing.T) {
	const restOfPrepare = 10 * time.Second // MIG create, CDI write, checkpoint
	for name, wait := range map[string]time.Duration{"mpsReady": mpsReady} {
		if wait+restOfPrepare > kubeletDRATimeout {
			t.Errorf("%s (%s) + the rest of a prepare (%s) exceeds the kubelet's DRA call timeout (%s)",
				name, wait, restOfPrepare, kubeletDRATimeout)
		}
	}
}
