package coexist

import (
	"strings"
	"testing"
)

// TestDevicePluginEventNoteFitsTheAPI: the API server refuses an event
// whose note is longer than 1024 bytes; a node of many GPUs withheld
// must still get its event.
func TestDevicePluginEventNoteFitsTheAPI(t *testing.T) {
	long := eventNote("withheld: %s", strings.Repeat("GPU 0 (GPU-3f66aa2b-09a2-5a3c-8cfd-d51d3efe5322), ", 64))
	if len(long) > 1024 || !strings.HasSuffix(long, "...") {
		t.Errorf("a long note is %d bytes (%q...), want at most 1024, ending in ...", len(long), long[:40])
	}
	if short := eventNote("GPU %d", 1); short != "GPU 1" {
		t.Errorf("a short note became %q", short)
	}
}
