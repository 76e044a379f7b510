package nvmock

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

// The state file of a persistent mock machine holds what a real GPU keeps
// while the driver is loaded, whatever happens to the processes using it:
// MIG mode, GPU and compute instances (with their IDs and placements, from
// which the mock derives MIG UUIDs), the compute mode, and what the GPUs
// and their processes are doing (their use, mockuse.go). Time-slice
// intervals are not here: the plugin sets them through nvidia-smi, not
// NVML, so they belong to the stand-in tools, not to the mock machine.
// Everything else (UUIDs, bus IDs, profiles) follows from the machine name
// and the seed, which the file records so that a machine is never rebuilt
// under another node's name.

// mockStateVersion is bumped on any incompatible change of the file. The
// use (mockuse.go) was added compatibly, in fields a file without use
// leaves out: files written before load as machines doing nothing, and a
// machine never given use writes the same file as before.
const mockStateVersion = 1

type mockState struct {
	Version int            `json:"version"`
	Machine string         `json:"machine"`
	Seed    string         `json:"seed"`
	GPUs    []mockGPUState `json:"gpus"`
}

type mockGPUState struct {
	UUID    string `json:"uuid"`
	MigMode int    `json:"migMode"`
	// PendingMigMode is a MIG mode set but not in effect until the GPU is
	// reset (GetMigMode's pending); nil when it is the current one.
	PendingMigMode *int `json:"pendingMigMode,omitempty"`
	// Minor is the GPU's minor number (/dev/nvidia<Minor>) since a MIG
	// mode change re-bound it; nil while it is the one the machine
	// starts with (its index).
	Minor *int `json:"minor,omitempty"`
	// Binding counts the GPU's re-binds: handles a process obtained at an
	// earlier one are stale (mockhandle.go), as are event registrations.
	Binding     int              `json:"binding,omitempty"`
	ComputeMode nvml.ComputeMode `json:"computeMode"`
	// NextGIID is the mock's GPU-instance counter: IDs are never reused
	// within a boot, so MIG UUIDs are never reused either.
	NextGIID uint32        `json:"nextGpuInstanceID"`
	GIs      []mockGIState `json:"gpuInstances,omitempty"`
	// Use and Processes are what the GPU is doing (mockuse.go): absent
	// in a file written before the machine had use, and for a GPU never
	// given any.
	Use       *mockUseState      `json:"use,omitempty"`
	Processes []mockProcessState `json:"processes,omitempty"`
	// MemoryLimits are the per-cgroup limits set on the GPU
	// (mockmemlimits.go), by cgroup.
	MemoryLimits []mockMemoryLimit `json:"memoryLimits,omitempty"`
}

type mockGIState struct {
	ID        uint32        `json:"id"`
	ProfileID uint32        `json:"profileID"`
	Start     uint32        `json:"start"`
	Size      uint32        `json:"size"`
	NextCIID  uint32        `json:"nextComputeInstanceID"`
	CIs       []mockCIState `json:"computeInstances,omitempty"`
	// Use is what the instance is doing (mockuse.go).
	Use *mockUseState `json:"use,omitempty"`
}

type mockCIState struct {
	ID        uint32 `json:"id"`
	ProfileID uint32 `json:"profileID"`
}

const (
	mockStatePrefix = "mock-"
	mockStateSuffix = ".json"
	// mockTempPrefix names files a write has not renamed yet; one left
	// behind is a writer killed mid-write, never a valid state.
	mockTempPrefix = ".tmp-"
)

// StatePath is the state file of a mock machine in a state directory.
func StatePath(dir, machine string) string {
	return filepath.Join(dir, mockStatePrefix+machine+mockStateSuffix)
}

// mockLockPath is the file flock'ed around every change of the state. It
// is not the state file itself: each write replaces that by rename, and a
// lock on a replaced inode excludes nobody.
func mockLockPath(statePath string) string {
	return strings.TrimSuffix(statePath, mockStateSuffix) + ".lock"
}

func encodeMockState(st *mockState) ([]byte, error) {
	data, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encoding mock machine state: %w", err)
	}
	return append(data, '\n'), nil
}

func decodeMockState(path string, data []byte) (*mockState, error) {
	var st mockState
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&st); err != nil {
		return nil, fmt.Errorf("mock machine state %s is damaged (delete it to start from a new machine): %w", path, err)
	}
	if st.Version != mockStateVersion {
		return nil, fmt.Errorf("mock machine state %s has version %d, want %d", path, st.Version, mockStateVersion)
	}
	return &st, nil
}

// captureGPU reads a device's state; computeMode is passed in because the
// mock keeps it in a closure (completeComputeMode), not in the device, and
// the pending MIG mode and the binding because the mock has none (mockGPU
// keeps them).
func captureGPU(d *server.Device, computeMode nvml.ComputeMode, pending *int, binding int) mockGPUState {
	d.RLock()
	defer d.RUnlock()
	st := mockGPUState{UUID: d.UUID, MigMode: d.MigMode, PendingMigMode: pending, ComputeMode: computeMode,
		NextGIID: d.GpuInstanceCounter, Binding: binding}
	if minor := d.Minor; minor != d.Index {
		st.Minor = &minor
	}
	for gi := range d.GpuInstances {
		st.GIs = append(st.GIs, captureGI(gi))
	}
	slices.SortFunc(st.GIs, func(a, b mockGIState) int { return cmp.Compare(a.ID, b.ID) })
	return st
}

func captureGI(gi *server.GpuInstance) mockGIState {
	gi.RLock()
	defer gi.RUnlock()
	st := mockGIState{ID: gi.Info.Id, ProfileID: gi.Info.ProfileId, Start: gi.Info.Placement.Start,
		Size: gi.Info.Placement.Size, NextCIID: gi.ComputeInstanceCounter}
	for ci := range gi.ComputeInstances {
		st.CIs = append(st.CIs, mockCIState{ID: ci.Info.Id, ProfileID: ci.Info.ProfileId})
	}
	slices.SortFunc(st.CIs, func(a, b mockCIState) int { return cmp.Compare(a.ID, b.ID) })
	return st
}

// sameGI tells whether an instance in memory is the one the state names;
// one with the same ID but another shape was replaced by another process.
func sameGI(gi *server.GpuInstance, st mockGIState) bool {
	return gi.Info.Id == st.ID && gi.Info.ProfileId == st.ProfileID &&
		gi.Info.Placement.Start == st.Start && gi.Info.Placement.Size == st.Size
}

// writeFileAtomic writes as the checkpoint does: a temporary file in the
// same directory, synced, renamed over the target, directory synced. It
// returns the written file, still open: its inode is now the target's, and
// holding it keeps the inode number from being reused, so comparing it
// with the path later tells reliably whether another process replaced it.
func writeFileAtomic(path string, data []byte) (*os.File, error) {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, mockTempPrefix+filepath.Base(path)+"-*")
	if err != nil {
		return nil, fmt.Errorf("writing %s: %w", path, err)
	}
	if err := writeSyncRename(tmp, path, data); err != nil {
		_ = tmp.Close()
		_ = os.Remove(tmp.Name())
		return nil, fmt.Errorf("writing %s: %w", path, err)
	}
	if err := syncDir(dir); err != nil {
		_ = tmp.Close()
		return nil, fmt.Errorf("writing %s: %w", path, err)
	}
	return tmp, nil
}

// beforeStateRename, set by tests, runs between a write and its rename,
// where a crash test kills the writer.
var beforeStateRename func()

func writeSyncRename(tmp *os.File, path string, data []byte) error {
	if _, err := tmp.Write(data); err != nil {
		return err
	}
	if err := tmp.Sync(); err != nil {
		return err
	}
	if beforeStateRename != nil {
		beforeStateRename()
	}
	return os.Rename(tmp.Name(), path)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer func() { _ = d.Close() }()
	return d.Sync()
}

// removeMockTemps deletes what writers killed before their rename left in
// the directory for this state file. The caller holds the state's lock, so
// no write of it is under way.
func removeMockTemps(statePath string) error {
	pattern := filepath.Join(filepath.Dir(statePath), mockTempPrefix+filepath.Base(statePath)+"-*")
	names, err := filepath.Glob(pattern)
	if err != nil {
		return fmt.Errorf("listing temporary files of %s: %w", statePath, err)
	}
	var errs []error
	for _, n := range names {
		if err := os.Remove(n); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("removing leftover %s: %w", n, err))
		}
	}
	return errors.Join(errs...)
}

// flockFile takes or drops a flock, retrying when a signal interrupts the
// wait (the Go runtime's preemption signals do).
func flockFile(f *os.File, how int) error {
	for {
		err := syscall.Flock(int(f.Fd()), how)
		if !errors.Is(err, syscall.EINTR) {
			return err
		}
	}
}

// withStateLock runs f holding the exclusive lock of a state file, as the
// real driver serialises changes of one GPU between all its clients.
func withStateLock(statePath string, f func() error) error {
	lock, err := os.OpenFile(mockLockPath(statePath), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("opening lock of %s: %w", statePath, err)
	}
	defer func() { _ = lock.Close() }() // closing drops the flock too
	if err := flockFile(lock, syscall.LOCK_EX); err != nil {
		return fmt.Errorf("locking %s: %w", statePath, err)
	}
	return f()
}
