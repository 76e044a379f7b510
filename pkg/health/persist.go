package health

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/gpuaas/gpu-dra-driver/pkg/atomicfile"
	"k8s.io/klog/v2"
)

// The faults outlive the plugin process: a plugin that restarts (a crash, a
// rolling update) must not offer again a GPU that raised a reset-required
// XID a minute ago, since the XID will not repeat. They do not outlive the
// boot: a reboot resets every GPU.

const stateVersion = 1

type savedFaults struct {
	Version int     `json:"version"`
	BootID  string  `json:"bootID"`
	Faults  []Fault `json:"faults"`
}

// load restores the faults saved in this boot. A missing, damaged or
// other-boot file restores nothing; only a damaged one is worth a log line.
func (m *Monitor) load(ctx context.Context) {
	if m.cfg.StatePath == "" || m.cfg.BootID == "" {
		return
	}
	logger := klog.FromContext(ctx)
	data, err := os.ReadFile(m.cfg.StatePath)
	if errors.Is(err, fs.ErrNotExist) {
		return
	}
	var saved savedFaults
	if err == nil {
		err = json.Unmarshal(data, &saved)
	}
	if err != nil || saved.Version != stateVersion {
		logger.Error(err, "Saved device faults not usable; starting with none", "path", m.cfg.StatePath, "version", saved.Version)
		return
	}
	if saved.BootID != m.cfg.BootID {
		logger.Info("Saved device faults are from another boot; a reboot reset the GPUs", "path", m.cfg.StatePath)
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for i := range saved.Faults {
		f := saved.Faults[i]
		if f.Kind == KindUnmonitored {
			continue // found again at registration
		}
		if f.Kind == KindGPULost {
			// Answering at the first probe then means it was reset meanwhile.
			m.lost[f.GPU] = true
		}
		m.faults[f.id()] = &f
	}
	logger.Info("Restored device faults", "count", len(m.faults))
}

// save writes the current faults; the caller holds saveMu so that saves
// land in the order of the changes they follow.
func (m *Monitor) save(ctx context.Context) {
	if m.cfg.StatePath == "" {
		return
	}
	data, err := json.Marshal(savedFaults{Version: stateVersion, BootID: m.cfg.BootID, Faults: m.Faults()})
	if err == nil {
		err = atomicfile.Write(m.cfg.StatePath, data, 0o600, ".health.json.tmp-*")
	}
	if err != nil {
		klog.FromContext(ctx).Error(fmt.Errorf("saving device faults: %w", err), "Device faults will not outlive a plugin restart")
	}
}
