package plugin

import (
	"os"
	"testing"
)

// TestPrepareOfOneClaimForTheWalk prepares one whole-GPU claim through the
// kubelet's call on a started driver; with WALK_SETUP_ONLY set it stops
// after the start. hack/callwalk/prepare-walk.sh runs it both ways under
// coverage and follows, through the code, the calls that ran in between:
// one claim's prepare, as a reader follows it (issue 34).
func TestPrepareOfOneClaimForTheWalk(t *testing.T) {
	m := newMaintEnv(t)
	if os.Getenv("WALK_SETUP_ONLY") != "" {
		return
	}
	if err := m.prepare(t, "whole", "gpu-3"); err != nil {
		t.Fatalf("preparing a whole GPU: %v", err)
	}
}
