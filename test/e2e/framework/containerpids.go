package framework

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// ContainerHostPID finds the host PID of a container's process, as NVML
// would report it for a process of that container using a GPU: the lowest
// PID under procRoot ("/proc") whose cgroup names the container's ID (the
// kubelet's cgroup of a container ends in it, with either cgroup driver).
// containerID is the runtime's ID, with or without the "containerd://" of
// a pod's status.
func ContainerHostPID(procRoot, containerID string) (uint32, error) {
	if _, id, found := strings.Cut(containerID, "://"); found {
		containerID = id
	}
	if containerID == "" {
		return 0, errors.New("no container ID")
	}
	entries, err := os.ReadDir(procRoot)
	if err != nil {
		return 0, fmt.Errorf("reading %s: %w", procRoot, err)
	}
	var found []uint32
	for _, e := range entries {
		pid, err := strconv.ParseUint(e.Name(), 10, 32)
		if err != nil {
			continue
		}
		// A process that exited meanwhile has no cgroup file left.
		data, err := os.ReadFile(filepath.Join(procRoot, e.Name(), "cgroup"))
		if err == nil && strings.Contains(string(data), containerID) {
			found = append(found, uint32(pid))
		}
	}
	if len(found) == 0 {
		return 0, fmt.Errorf("no process in %s is in container %s's cgroup", procRoot, containerID)
	}
	return slices.Min(found), nil
}
