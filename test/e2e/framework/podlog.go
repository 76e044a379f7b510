package framework

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
)

// ReadContainerLog returns what a container wrote, read from the kubelet's
// log files (podLogsDir/<namespace>_<pod>_<uid>/<container>/<restart>.log,
// CRI format "<time> <stream> <P|F> <text>"). The kubelet's API is not
// reachable here (its node IP is not loopback), so `kubectl logs` cannot be
// used; the files are what it would serve. Partial lines are joined.
func ReadContainerLog(podLogsDir string, pod *v1.Pod, container string) (string, error) {
	dir := filepath.Join(podLogsDir, fmt.Sprintf("%s_%s_%s", pod.Namespace, pod.Name, pod.UID), container)
	files, err := filepath.Glob(filepath.Join(dir, "*.log"))
	if err != nil || len(files) == 0 {
		return "", fmt.Errorf("no log of container %s in %s", container, dir)
	}
	sort.Strings(files)
	// The newest restart's log: the highest number.
	f, err := os.Open(files[len(files)-1])
	if err != nil {
		return "", fmt.Errorf("reading container log: %w", err)
	}
	defer func() { _ = f.Close() }()
	var out strings.Builder
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), " ", 4)
		if len(parts) < 4 {
			continue
		}
		out.WriteString(parts[3])
		if parts[2] == "F" {
			out.WriteByte('\n')
		}
	}
	return out.String(), sc.Err()
}

// containsLine reports whether text has a line equal to want.
func containsLine(text, want string) bool {
	for _, l := range strings.Split(text, "\n") {
		if l == want {
			return true
		}
	}
	return false
}

// ContainerLogBetween returns the lines a container wrote from from to
// to, by the kubelet's timestamps, across all its restarts' log files (a
// container restarted during an event wrote part of it in each).
func ContainerLogBetween(podLogsDir string, pod *v1.Pod, container string, from, to time.Time) ([]string, error) {
	dir := filepath.Join(podLogsDir, fmt.Sprintf("%s_%s_%s", pod.Namespace, pod.Name, pod.UID), container)
	files, err := filepath.Glob(filepath.Join(dir, "*.log"))
	if err != nil || len(files) == 0 {
		return nil, fmt.Errorf("no log of container %s in %s", container, dir)
	}
	var lines []string
	for _, file := range files {
		fileLines, err := logLinesBetween(file, from, to)
		if err != nil {
			return nil, err
		}
		lines = append(lines, fileLines...)
	}
	return lines, nil
}

// logLinesBetween reads one CRI log file's lines stamped from from to to,
// partial lines joined.
func logLinesBetween(file string, from, to time.Time) ([]string, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, fmt.Errorf("reading container log: %w", err)
	}
	defer func() { _ = f.Close() }()
	var lines []string
	var partial strings.Builder
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), " ", 4)
		if len(parts) < 4 {
			continue
		}
		partial.WriteString(parts[3])
		if parts[2] != "F" {
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, parts[0])
		if err == nil && !at.Before(from) && !at.After(to) {
			lines = append(lines, partial.String())
		}
		partial.Reset()
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading %s: %w", file, err)
	}
	return lines, nil
}
