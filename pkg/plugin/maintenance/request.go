package maintenance

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/gpuaas/gpu-dra-driver/pkg/atomicfile"
	"k8s.io/klog/v2"
)

// An operator talks to the running plugin as for --clear-faults: through
// files in the plugin's data directory, from `kubectl exec` into its pod.
// A request file holds the latest request; the plugin takes it at its
// next look (Options.Interval) and answers in a status file,
// which names the request it answered so that the command can wait for
// its own answer: a release is not done, and rmmod not safe, until NVML
// is shut down.

// Maintenance actions.
const (
	ActionRelease   = "release"
	ActionReacquire = "reacquire"
)

// Maintenance states the status file reports.
const (
	StateServing     = "serving"
	StateReleased    = "released"
	StateReacquiring = "reacquiring"
	// StateRestarting: the plugin executes itself again to load a new
	// driver's library (nvdev.ErrNewProcessNeeded); the new process
	// serves once the driver is loaded.
	StateRestarting = "restarting"
)

const (
	requestFile     = "request.json"
	statusFile      = "status.json"
	maintenanceTemp = ".maintenance-*"
)

// Dir is where a plugin with data directory dataDir takes maintenance
// requests.
func Dir(dataDir string) string { return filepath.Join(dataDir, "maintenance") }

type request struct {
	Action string `json:"action"`
	ID     string `json:"id"`
}

// Status is the plugin's answer.
type Status struct {
	State string `json:"state"`
	// DriverVersion is the driver the plugin's session (and the CDI specs
	// it writes) was last opened on.
	DriverVersion string    `json:"driverVersion,omitempty"`
	Reason        string    `json:"reason,omitempty"`
	Since         time.Time `json:"since"`
	// Request is the last request answered (or being answered).
	Request string `json:"request,omitempty"`
	// Error is why the last request failed.
	Error string `json:"error,omitempty"`
}

// Request asks the plugin watching dir to release or reacquire the GPUs;
// it returns the request's ID, which the answer names.
func Request(dir, action string) (string, error) {
	if action != ActionRelease && action != ActionReacquire {
		return "", fmt.Errorf("maintenance request %q: want %q or %q", action, ActionRelease, ActionReacquire)
	}
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("maintenance request: %w", err)
	}
	req := request{Action: action, ID: hex.EncodeToString(b[:])}
	data, err := json.Marshal(req)
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return "", fmt.Errorf("maintenance request: %w", err)
	}
	if err := atomicfile.Replace(filepath.Join(dir, requestFile), data, 0o600, maintenanceTemp); err != nil {
		return "", fmt.Errorf("maintenance request: %w", err)
	}
	return req.ID, nil
}

// ReadStatus reads the plugin's answer; ok is false before the plugin
// wrote one.
func ReadStatus(dir string) (st Status, ok bool, err error) {
	data, err := os.ReadFile(filepath.Join(dir, statusFile))
	if errors.Is(err, fs.ErrNotExist) {
		return st, false, nil
	}
	if err == nil {
		err = json.Unmarshal(data, &st)
	}
	if err != nil {
		return st, false, fmt.Errorf("reading the plugin's maintenance status: %w", err)
	}
	return st, true, nil
}

// Wait waits, as long as ctx allows, for the plugin's answer to request id
// to reach one of want; it returns the last status read.
func Wait(ctx context.Context, dir, id string, want ...string) (Status, error) {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		st, ok, err := ReadStatus(dir)
		if err != nil {
			return st, err
		}
		if ok && st.Request == id {
			if st.Error != "" {
				return st, errors.New(st.Error)
			}
			if slices.Contains(want, st.State) {
				return st, nil
			}
		}
		select {
		case <-ctx.Done():
			return st, ctx.Err()
		case <-t.C:
		}
	}
}

// takeRequest removes and returns the pending request, if any.
func takeRequest(ctx context.Context, dir string) (request, bool) {
	var req request
	path := filepath.Join(dir, requestFile)
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return req, false
	}
	if err == nil {
		err = json.Unmarshal(data, &req)
	}
	if rmErr := os.Remove(path); rmErr != nil && !errors.Is(rmErr, fs.ErrNotExist) {
		klog.FromContext(ctx).Error(rmErr, "Removing a maintenance request", "path", path)
	}
	if err != nil {
		klog.FromContext(ctx).Error(err, "Ignoring an unreadable maintenance request", "path", path)
		return req, false
	}
	return req, true
}

// writeStatus answers in the status file; request is the request being
// answered ("" for none), failed its error.
func (m *Maintenance) writeStatus(ctx context.Context, state, request string, failed error) {
	if m.opts.Dir == "" {
		return
	}
	m.mu.Lock()
	st := Status{State: state, DriverVersion: m.opts.Session.System().DriverVersion, Reason: m.reason,
		Since: m.since, Request: request}
	m.mu.Unlock()
	if failed != nil {
		st.Error = failed.Error()
	}
	data, err := json.Marshal(st)
	if err == nil {
		if err = os.MkdirAll(m.opts.Dir, 0o750); err == nil {
			err = atomicfile.Replace(filepath.Join(m.opts.Dir, statusFile), data, 0o644, maintenanceTemp)
		}
	}
	if err != nil {
		klog.FromContext(ctx).Error(err, "Writing the maintenance status", "dir", m.opts.Dir)
	}
}
