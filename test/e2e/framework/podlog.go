package framework

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

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
