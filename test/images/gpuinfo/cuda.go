package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"sort"
	"strings"
	"time"
)

const (
	// libProbeTimeout bounds loading and initializing the driver libraries:
	// cuInit can block on a broken GPU, and a report that never appears
	// tells a test less than one that says the probe hung.
	libProbeTimeout = time.Minute
	// smiTimeout bounds nvidia-smi, for the same reason.
	smiTimeout = 20 * time.Second
	// smiWaitDelay is how long to wait for nvidia-smi's output after it
	// was killed, in case a child of it still holds the pipe.
	smiWaitDelay = time.Second
)

// cudaLines reports what a CUDA program in the container would get from
// the driver: per library, whether it loads, from where, and what its
// initialization returns (probeLibraries), and how nvidia-smi ends. Sorted.
func cudaLines() []string {
	lines := withTimeout(libProbeTimeout, probeLibraries)
	lines = append(lines, nvidiaSMILine(smiTimeout))
	sort.Strings(lines)
	return lines
}

// withTimeout returns probe's lines, or a line saying it did not finish
// within d. A probe stuck in C code cannot be cancelled; its goroutine is
// left behind, which is fine for a program that only sleeps afterwards.
func withTimeout(d time.Duration, probe func() []string) []string {
	done := make(chan []string, 1)
	go func() { done <- probe() }()
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case lines := <-done:
		return lines
	case <-timer.C:
		return []string{fmt.Sprintf("cuda probe timeout=%s", d)}
	}
}

// nvidiaSMILine runs nvidia-smi from PATH, as a user in the container
// would, and reports "nvidia-smi exit=<code> <first output line>", or why
// it did not run.
func nvidiaSMILine(timeout time.Duration) string {
	bin, err := exec.LookPath("nvidia-smi")
	if errors.Is(err, exec.ErrNotFound) {
		return "nvidia-smi not-found"
	}
	if err != nil {
		return "nvidia-smi error=" + oneLine(err.Error())
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin)
	cmd.WaitDelay = smiWaitDelay
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		return fmt.Sprintf("nvidia-smi timeout=%s", timeout)
	}
	code := 0
	if err != nil {
		var exitErr *exec.ExitError
		if !errors.As(err, &exitErr) {
			// It did not start, e.g. its interpreter (ld.so) is missing.
			return "nvidia-smi error=" + oneLine(err.Error())
		}
		code = exitErr.ExitCode()
	}
	return strings.TrimSpace(fmt.Sprintf("nvidia-smi exit=%d %s", code, firstLine(string(out))))
}

// firstLine returns the first non-blank line of text, trimmed.
func firstLine(text string) string {
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		if line := strings.TrimSpace(sc.Text()); line != "" {
			return line
		}
	}
	return ""
}

// oneLine keeps a multi-line message (dlerror's, for one) on its report
// line.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
