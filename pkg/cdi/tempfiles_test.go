package cdi

import (
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"

	"github.com/go-logr/logr"
)

// During a rolling update the old plugin pod may be writing a claim's spec
// while the new one starts: the new one's clean-up removes only the temp
// files no writer holds (a crashed writer's), not the one in flight, whose
// writer holds a lock on it until it is renamed.
func TestNewHandlerKeepsATempFileInFlight(t *testing.T) {
	cdiRoot := t.TempDir()
	inFlight := "." + specFileName("writing") + tempInfix + "1"
	abandoned := "." + specFileName("crashed") + tempInfix + "2"
	for _, name := range []string{inFlight, abandoned} {
		if err := os.WriteFile(filepath.Join(cdiRoot, name), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	writer, err := os.Open(filepath.Join(cdiRoot, inFlight))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = writer.Close() }()
	if err := syscall.Flock(int(writer.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	if _, err := NewHandler(Options{CDIRoot: cdiRoot, Logger: logr.Discard()}); err != nil {
		t.Fatal(err)
	}
	if got := dirNames(t, cdiRoot); !slices.Equal(got, []string{inFlight}) {
		t.Errorf("CDI root holds %v, want only the spec in flight, %s", got, inFlight)
	}
}
