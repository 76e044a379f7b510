package nvmock

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"k8s.io/klog/v2"
)

// mockMachine keeps a go-nvml mock machine in a state file, so that it
// outlives the process, as a real GPU outlives the plugin: a restarted
// plugin, or a second one during a rolling update, finds the MIG devices
// and settings its predecessor left.
//
// It wraps the mock's functions (the same way pkg/mig/migtest does), so the
// types stay go-nvml's and the plugin sees them through nvdev.Interface as
// before. Every mutating call runs under the file's flock: reload what
// other processes wrote, apply the call, write the result atomically.
// Every call that reads mutable state first reloads the file if another
// process replaced it, so two processes see one machine.
type mockMachine struct {
	machine, seed, path string

	mu sync.Mutex // orders this process's loads and changes; guards below
	// loaded is the state file last read or written, kept open (see
	// writeFileAtomic); nil makes the next call reload.
	loaded *os.File
	data   []byte // what loaded holds
	gpus   []*mockGPU
	// gis are the GPU instances in memory with their unwrapped functions.
	gis map[*server.GpuInstance]*mockGI
	// faults are what is injected from outside (mockfaults.go).
	faults *mockFaults
}

// mockGPU is one mock device with the functions it had before wrapping:
// restoring the state calls these, not the wrappers, which would lock and
// write again.
type mockGPU struct {
	d              *server.Device
	createGIAt     func(*nvml.GpuInstanceProfileInfo, *nvml.GpuInstancePlacement) (nvml.GpuInstance, nvml.Return)
	getComputeMode func() (nvml.ComputeMode, nvml.Return)
	setComputeMode func(nvml.ComputeMode) nvml.Return
	setMigMode     func(int) (nvml.Return, nvml.Return)
	// pending is the MIG mode waiting for a reset (mockmigmode.go), nil
	// for none; guarded by the machine's mu, replaced, never changed.
	pending *int
	// binding counts the GPU's re-binds (mockhandle.go); guarded by the
	// machine's mu. handle is the handle this process hands out for
	// binding handleBinding.
	binding       int
	handle        nvml.Device
	handleBinding int
	// use and procs are what the GPU is doing, as the state file last
	// read or written holds them (mockuse.go); guarded by the machine's
	// mu, replaced, never changed.
	use   *mockUseState
	procs []mockProcessState
	// memoryLimits are the GPU's per-cgroup limits (mockmemlimits.go);
	// guarded by the machine's mu, replaced, never changed.
	memoryLimits []mockMemoryLimit
}

type mockGI struct {
	gi       *server.GpuInstance
	createCI func(*nvml.ComputeInstanceProfileInfo) (nvml.ComputeInstance, nvml.Return)
	// use is what the instance is doing, as mockGPU's use.
	use *mockUseState
}

// persistMock makes a completed mock machine persistent in dir: rebuilt
// from its state file if there is one, otherwise the file is created.
func persistMock(s *server.Server, dir, machine, seed string) error {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return fmt.Errorf("creating mock NVML state directory: %w", err)
	}
	m := &mockMachine{machine: machine, seed: seed, path: StatePath(dir, machine),
		gis: map[*server.GpuInstance]*mockGI{}, faults: newMockFaults(dir, machine)}
	m.wrapServer(s)
	m.mu.Lock()
	defer m.mu.Unlock()
	return withStateLock(m.path, m.openLocked)
}

// openLocked loads the state file, or writes the fresh machine as the
// first state. A temporary file left by a writer killed before its rename
// is dropped: the state is the last one renamed into place.
func (m *mockMachine) openLocked() error {
	if err := removeMockTemps(m.path); err != nil {
		return err
	}
	err := m.syncLocked()
	if errors.Is(err, fs.ErrNotExist) {
		return m.saveLocked()
	}
	return err
}

// report logs what a mock NVML call cannot return: the call itself
// answers ERROR_UNKNOWN, as real NVML does when the driver fails.
func (m *mockMachine) report(err error) {
	klog.Background().Error(err, "Persistent mock NVML machine", "machine", m.machine, "state", m.path)
}

// fresh brings the machine up to date before a read; false if it cannot.
// Reads take no flock: the file is only ever replaced whole by rename.
func (m *mockMachine) fresh() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.syncLocked(); err != nil {
		m.report(err)
		return false
	}
	return true
}

// change runs one mutating call as the driver would: exclusively, on the
// current state, and recorded before the call returns. A call that fails
// to be recorded (or panics) is undone by reloading the last state, so the
// file and memory never disagree.
func (m *mockMachine) change(call func() nvml.Return) nvml.Return {
	m.mu.Lock()
	defer m.mu.Unlock()
	ret := nvml.ERROR_UNKNOWN
	err := withStateLock(m.path, func() error {
		saved := false
		defer func() {
			if !saved {
				m.forgetLocked()
			}
		}()
		if err := m.syncLocked(); err != nil {
			return err
		}
		ret = call()
		if err := m.saveLocked(); err != nil {
			ret = nvml.ERROR_UNKNOWN
			return err
		}
		saved = true
		return nil
	})
	if err != nil {
		m.report(err)
		return nvml.ERROR_UNKNOWN
	}
	return ret
}

func (m *mockMachine) forgetLocked() {
	if m.loaded != nil {
		_ = m.loaded.Close()
	}
	m.loaded, m.data = nil, nil
}

// currentLocked tells whether memory holds what the state file holds now.
func (m *mockMachine) currentLocked() (bool, error) {
	if m.loaded == nil {
		return false, nil
	}
	onDisk, err := os.Stat(m.path)
	if err != nil {
		return false, fmt.Errorf("checking mock machine state: %w", err)
	}
	held, err := m.loaded.Stat()
	if err != nil {
		return false, fmt.Errorf("checking mock machine state: %w", err)
	}
	return os.SameFile(onDisk, held), nil
}

// syncLocked reloads the state file if another process (or a simulated
// reboot) replaced it since this one last read or wrote it.
func (m *mockMachine) syncLocked() error {
	if ok, err := m.currentLocked(); ok || err != nil {
		return err
	}
	f, err := os.Open(m.path)
	if err != nil {
		return fmt.Errorf("opening mock machine state: %w", err)
	}
	data, err := io.ReadAll(f)
	if err != nil {
		err = fmt.Errorf("reading mock machine state: %w", err)
	} else {
		err = m.applyData(data)
	}
	if err != nil {
		_ = f.Close()
		return err
	}
	m.forgetLocked()
	m.loaded, m.data = f, data
	return nil
}

func (m *mockMachine) applyData(data []byte) error {
	st, err := decodeMockState(m.path, data)
	if err != nil {
		return err
	}
	if st.Machine != m.machine || st.Seed != m.seed {
		return fmt.Errorf("mock machine state %s is machine %q of node %q, not %q of %q", m.path, st.Machine, st.Seed, m.machine, m.seed)
	}
	return m.apply(st)
}

// saveLocked writes the machine's state if it changed.
func (m *mockMachine) saveLocked() error {
	data, err := encodeMockState(m.capture())
	if err != nil {
		return err
	}
	if m.loaded != nil && string(data) == string(m.data) {
		return nil
	}
	if err := removeMockTemps(m.path); err != nil {
		return err
	}
	f, err := writeFileAtomic(m.path, data)
	if err != nil {
		return err
	}
	m.forgetLocked()
	m.loaded, m.data = f, data
	return nil
}

func (m *mockMachine) capture() *mockState {
	st := &mockState{Version: mockStateVersion, Machine: m.machine, Seed: m.seed}
	for _, g := range m.gpus {
		mode, _ := g.getComputeMode()
		gst := captureGPU(g.d, mode, g.pending, g.binding)
		m.captureUse(g, &gst)
		gst.MemoryLimits = g.memoryLimits
		st.GPUs = append(st.GPUs, gst)
	}
	return st
}

// captureUse records what a GPU and its instances are doing. Processes
// on an instance destroyed since are dropped: they ended with it.
func (m *mockMachine) captureUse(g *mockGPU, st *mockGPUState) {
	st.Use = g.use
	for i := range st.GIs {
		for gi, mg := range m.gis {
			if gi.Info.Device == nvml.Device(g.d) && gi.Info.Id == st.GIs[i].ID {
				st.GIs[i].Use = mg.use
			}
		}
	}
	st.Processes = g.procs
	st.Processes = useViewOf(st).alive()
	if len(st.Processes) == 0 {
		st.Processes = nil
	}
}

// shutdown releases the state file when NVML is shut down.
func (m *mockMachine) shutdown() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.forgetLocked()
}
