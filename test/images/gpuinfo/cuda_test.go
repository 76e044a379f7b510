package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// smiFailure is what nvidia-smi prints on a node without the kernel module.
const smiFailure = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. " +
	"Make sure that the latest NVIDIA driver is installed and running."

func TestNvidiaSMILine(t *testing.T) {
	for _, tc := range []struct {
		name, script string
		timeout      time.Duration
		want         string // BIN stands for the fake's path
	}{{
		name:   "driver not loaded",
		script: "#!/bin/sh\necho\necho \"" + smiFailure + "\"\necho more >&2\nexit 9\n",
		want:   "nvidia-smi exit=9 " + smiFailure,
	}, {
		name:   "output on stderr only",
		script: "#!/bin/sh\necho '  Failed to initialize NVML  ' >&2\nexit 9\n",
		want:   "nvidia-smi exit=9 Failed to initialize NVML",
	}, {
		name:   "success",
		script: "#!/bin/sh\necho 'Tue Nov 25 18:32:00 2025'\necho table\n",
		want:   "nvidia-smi exit=0 Tue Nov 25 18:32:00 2025",
	}, {
		name:   "silent failure",
		script: "#!/bin/sh\nexit 3\n",
		want:   "nvidia-smi exit=3",
	}, {
		name:   "hangs",
		script: "#!/bin/sh\nexec sleep 30\n",
		// Short, so the test is quick; the kill must still end the wait.
		timeout: 200 * time.Millisecond,
		want:    "nvidia-smi timeout=200ms",
	}, {
		name:   "cannot start",
		script: "#!/nonexistent/sh\n",
		want:   "nvidia-smi error=fork/exec BIN: no such file or directory",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			bin := writeNvidiaSMI(t, tc.script)
			// The system directories stay in PATH for sleep; the fake
			// comes first, so a real nvidia-smi there is not run.
			t.Setenv("PATH", filepath.Dir(bin)+":/usr/bin:/bin")
			timeout := tc.timeout
			if timeout == 0 {
				timeout = smiTimeout
			}
			want := strings.ReplaceAll(tc.want, "BIN", bin)
			if got := nvidiaSMILine(timeout); got != want {
				t.Errorf("nvidiaSMILine = %q, want %q", got, want)
			}
		})
	}
}

func TestNvidiaSMILineNotFound(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	if got, want := nvidiaSMILine(smiTimeout), "nvidia-smi not-found"; got != want {
		t.Errorf("nvidiaSMILine = %q, want %q", got, want)
	}
}

func TestWithTimeout(t *testing.T) {
	fast := func() []string { return []string{"cuda a", "cuda b"} }
	if got, want := withTimeout(time.Minute, fast), []string{"cuda a", "cuda b"}; !slices.Equal(got, want) {
		t.Errorf("withTimeout(fast probe) = %q, want %q", got, want)
	}
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	stuck := func() []string { <-release; return []string{"cuda late"} }
	if got, want := withTimeout(10*time.Millisecond, stuck), []string{"cuda probe timeout=10ms"}; !slices.Equal(got, want) {
		t.Errorf("withTimeout(stuck probe) = %q, want %q", got, want)
	}
}

// writeNvidiaSMI writes an executable nvidia-smi with the given text into a
// new directory and returns its path.
func writeNvidiaSMI(t *testing.T, script string) string {
	t.Helper()
	bin := filepath.Join(realTempDir(t), "nvidia-smi")
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return bin
}

// realTempDir returns a new temporary directory by its path without
// symbolic links, the form in which the probe reports paths.
func realTempDir(t *testing.T) string {
	t.Helper()
	dir, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return dir
}
