package e2e

import (
	"testing"
	"time"

	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

// registrationRestarts is how many times TestPluginRegistersOnFirstDial
// restarts the plugin: BENCHMARKS.md's restart rows saw one refused
// registration in about ten restarts.
const registrationRestarts = 40

// TestPluginRegistersOnFirstDial: the kubelet (here its simulator, which
// dials as the kubelet's plugin watcher does: at the inotify event of the
// socket's creation) registers the plugin on its first try after every
// restart, a SIGKILL (the old sockets left behind) or a SIGTERM (removed).
// A registration socket that could be seen before it accepted connections
// was refused, and the kubelet retried only after its backoff and its
// one-second reconcile pass: the second-long tail of the restart rows.
func TestPluginRegistersOnFirstDial(t *testing.T) {
	node := startNode(t)
	ctx := framework.Context(t, 10*time.Minute)
	for i := range registrationRestarts {
		restart, how := node.KillPlugin, "SIGKILL"
		if i%2 == 1 {
			restart, how = node.RestartPlugin, "SIGTERM"
		}
		if err := restart(ctx); err != nil {
			t.Fatalf("restart %d (%s): %v", i+1, how, err)
		}
	}
	if failed := node.Sim.FailedRegistrations(); len(failed) > 0 {
		t.Errorf("%d of %d registrations after a restart needed a retry (the first: %v)",
			len(failed), registrationRestarts+1, failed[0])
	}
}
