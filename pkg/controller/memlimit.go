package controller

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"runtime/debug"
	"strconv"
	"strings"

	"k8s.io/klog/v2"
)

// MemoryLimitEnv is the container's memory limit in bytes, as the chart
// passes it (downward API, resourceFieldRef limits.memory).
const MemoryLimitEnv = "GPUAAS_MEMORY_LIMIT"

// cgroupMemoryMax is the cgroup v2 memory limit of this container.
const cgroupMemoryMax = "/sys/fs/cgroup/memory.max"

// memoryLimitShare of the container's limit is the heap the Go collector
// aims under: the rest is for what the runtime does not count as heap
// (stacks, the binary) and for the collector to catch up.
const memoryLimitShare = 0.9

// SetMemoryLimit aims the Go collector under the container's memory limit
// when GOMEMLIMIT does not set it: without it the heap may double past the
// limit between collections and the kernel kills the process (both
// replicas at once, and the fail-closed claim webhook refuses every claim).
func SetMemoryLimit(ctx context.Context) {
	logger := klog.FromContext(ctx)
	target, found, err := memoryTarget(cgroupMemoryMax)
	if err != nil {
		logger.Error(err, "Reading the container's memory limit; the Go collector runs by GOGC alone")
		return
	}
	if found {
		debug.SetMemoryLimit(target)
		logger.Info("Go memory limit set from the container's", "bytes", target)
	}
}

// memoryTarget is the memory limit for the Go runtime: memoryLimitShare of
// MemoryLimitEnv, else of the cgroup's limit; none when GOMEMLIMIT is set
// (the runtime read it) or the container has no limit.
func memoryTarget(cgroupFile string) (int64, bool, error) {
	if os.Getenv("GOMEMLIMIT") != "" {
		return 0, false, nil
	}
	limit, err := containerMemoryLimit(cgroupFile)
	if err != nil || limit <= 0 {
		return 0, false, err
	}
	return int64(float64(limit) * memoryLimitShare), true, nil
}

func containerMemoryLimit(cgroupFile string) (int64, error) {
	if v := os.Getenv(MemoryLimitEnv); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%s=%q: %w", MemoryLimitEnv, v, err)
		}
		return n, nil
	}
	raw, err := os.ReadFile(cgroupFile)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil // not cgroup v2, or not in a container
	}
	if err != nil {
		return 0, fmt.Errorf("reading %s: %w", cgroupFile, err)
	}
	v := strings.TrimSpace(string(raw))
	if v == "max" {
		return 0, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s holds %q: %w", cgroupFile, v, err)
	}
	return n, nil
}
