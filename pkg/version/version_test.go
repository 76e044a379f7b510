package version

import (
	"runtime"
	"strings"
	"testing"
)

func TestDefaults(t *testing.T) {
	if got := Version(); got != "dev" {
		t.Errorf("Version() = %q without -ldflags, want dev", got)
	}
	if Commit() == "" {
		t.Error("Commit() is empty")
	}
	s := String("x")
	if !strings.HasPrefix(s, "x dev (commit ") || !strings.Contains(s, runtime.Version()) {
		t.Errorf("String() = %q", s)
	}
}
