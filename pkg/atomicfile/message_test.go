package atomicfile

import (
	"errors"
	"os"
	"strings"
	"syscall"
	"testing"
)

// A full disk fails the temporary file's write with an *os.PathError that
// already names the temporary file; the message must name it once and name
// the file being replaced, which is what an operator looks for.
func TestTempErrorNamesEachPathOnce(t *testing.T) {
	tmp := "/var/lib/gpuaas/.records-123"
	cause := &os.PathError{Op: "write", Path: tmp, Err: syscall.ENOSPC}
	err := tempError("writing", "/var/lib/gpuaas/records", tmp, cause)
	msg := err.Error()
	if n := strings.Count(msg, tmp); n != 1 {
		t.Errorf("message names the temporary file %d times, want 1: %q", n, msg)
	}
	if !strings.HasPrefix(msg, "writing /var/lib/gpuaas/records:") {
		t.Errorf("message does not name the replaced file: %q", msg)
	}
	if !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("error does not wrap ENOSPC: %v", err)
	}
}
