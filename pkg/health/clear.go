package health

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/gpuaas/gpu-dra-driver/pkg/atomicfile"
	"k8s.io/klog/v2"
)

// ClearAll, as a GPU in RequestClear, clears the faults of every GPU.
const ClearAll = "all"

// RequestClear asks the monitor watching dir (Config.ClearDir) to clear
// the faults of a GPU (its UUID, or ClearAll): what an operator does after
// resetting a GPU (nvidia-smi -r) that the probe did not see go away, since
// only a reset clears a reset-required XID. It is a file the monitor reads
// at its next probe, so it works from `kubectl exec` into the plugin pod.
func RequestClear(dir, gpu string) error {
	if gpu == "" || filepath.Base(gpu) != gpu || gpu == "." || gpu == ".." {
		return fmt.Errorf("clear request: %q is not a GPU UUID or %q", gpu, ClearAll)
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return fmt.Errorf("clear request: %w", err)
	}
	return atomicfile.Write(filepath.Join(dir, gpu), nil, 0o600, ".clear-*")
}

// applyClears clears what operators asked for and removes their requests.
// A GPU that still does not answer is found lost again at the next probe.
func (m *Monitor) applyClears(ctx context.Context) {
	if m.cfg.ClearDir == "" {
		return
	}
	entries, err := os.ReadDir(m.cfg.ClearDir)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			klog.FromContext(ctx).Error(err, "Reading fault clear requests", "dir", m.cfg.ClearDir)
		}
		return
	}
	for _, e := range entries {
		gpu := e.Name()
		if e.IsDir() || gpu[0] == '.' {
			continue
		}
		klog.FromContext(ctx).Info("Clearing faults at an operator's request", "gpu", gpu)
		m.mu.Lock()
		for uuid := range m.lost {
			if gpu == ClearAll || uuid == gpu {
				m.lost[uuid] = false
			}
		}
		m.mu.Unlock()
		m.clear(ctx, func(f *Fault) bool {
			return (gpu == ClearAll || f.GPU == gpu) && f.Kind != KindCleanupBlocked && f.Kind != KindUnmonitored
		})
		if err := os.Remove(filepath.Join(m.cfg.ClearDir, gpu)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			klog.FromContext(ctx).Error(err, "Removing a fault clear request", "gpu", gpu)
		}
	}
}
