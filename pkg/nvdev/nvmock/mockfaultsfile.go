package nvmock

// The faults file of a persistent mock machine: how the fault state is
// found, read, changed under the file's lock and written back (the
// injection API and NVML's view of the faults are in mockfaults.go).

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"time"
)

// log appends an event with the next seq, dropping the oldest beyond
// maxMockEvents.
func (st *mockFaultState) log(ev mockEvent) {
	st.LastSeq++
	ev.Seq, ev.Time = st.LastSeq, time.Now().UTC()
	st.Events = append(st.Events, ev)
	if extra := len(st.Events) - maxMockEvents; extra > 0 {
		st.Events = st.Events[extra:]
	}
}

// setGPU changes a GPU's standing faults, dropping the entry of a GPU left
// with none so that the file lists only faulty GPUs.
func (st *mockFaultState) setGPU(uuid string, change func(*mockGPUFaults)) {
	g := st.GPUs[uuid]
	change(&g)
	if reflect.ValueOf(g).IsZero() {
		delete(st.GPUs, uuid)
		return
	}
	if st.GPUs == nil {
		st.GPUs = map[string]mockGPUFaults{}
	}
	st.GPUs[uuid] = g
}

// mockGPURef is a GPU named from outside the plugin.
type mockGPURef struct{ machine, uuid string }

// findMockGPU finds a GPU by index or UUID in the machines of a state
// directory. An index needs a single machine there (the usual case: one
// plugin, one machine); a UUID is unique across machines.
func findMockGPU(dir, gpu string) (mockGPURef, error) {
	states, err := mockMachineStates(dir)
	if err != nil {
		return mockGPURef{}, err
	}
	if i, err := strconv.Atoi(gpu); err == nil {
		return gpuByIndex(dir, states, i)
	}
	for _, st := range states {
		for _, g := range st.GPUs {
			if g.UUID == gpu {
				return mockGPURef{machine: st.Machine, uuid: g.UUID}, nil
			}
		}
	}
	return mockGPURef{}, fmt.Errorf("no GPU %q on the mock machines in %s: name one by index or by UUID (GPU-...)", gpu, dir)
}

func gpuByIndex(dir string, states []*mockState, i int) (mockGPURef, error) {
	if len(states) != 1 {
		return mockGPURef{}, fmt.Errorf("%s holds %d mock machines: name the GPU by UUID, not index", dir, len(states))
	}
	st := states[0]
	if i < 0 || i >= len(st.GPUs) {
		return mockGPURef{}, fmt.Errorf("no GPU %d on mock machine %s: it has GPUs 0 to %d", i, st.Machine, len(st.GPUs)-1)
	}
	return mockGPURef{machine: st.Machine, uuid: st.GPUs[i].UUID}, nil
}

// mockMachineStates reads the state of every persistent mock machine in
// dir, without its lock: state files are only ever replaced whole.
func mockMachineStates(dir string) ([]*mockState, error) {
	if _, err := os.Stat(dir); err != nil {
		return nil, fmt.Errorf("mock NVML state directory: %w", err)
	}
	paths, err := filepath.Glob(filepath.Join(dir, mockStatePrefix+"*"+mockStateSuffix))
	if err != nil {
		return nil, fmt.Errorf("listing mock machines in %s: %w", dir, err)
	}
	if len(paths) == 0 {
		return nil, fmt.Errorf("no mock machine in %s: it appears when a plugin first opens --nvml=mock:<machine> with --mock-nvml-state-dir=%s", dir, dir)
	}
	states := make([]*mockState, 0, len(paths))
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("reading mock machine state: %w", err)
		}
		st, err := decodeMockState(p, data)
		if err != nil {
			return nil, err
		}
		states = append(states, st)
	}
	return states, nil
}

// changeGPUFaults changes the faults of one GPU (an index or a UUID) of
// the persistent mock machine in dir.
func changeGPUFaults(dir, gpu string, change func(*mockGPUFaults)) error {
	ref, err := findMockGPU(dir, gpu)
	if err != nil {
		return err
	}
	return updateMockFaults(dir, ref.machine, func(st *mockFaultState) { st.setGPU(ref.uuid, change) })
}

// updateMockFaults changes a machine's faults file under its own lock,
// writing it whole, so readers (which take no lock) never see half of it.
func updateMockFaults(dir, machine string, change func(*mockFaultState)) error {
	path := FaultsPath(dir, machine)
	err := withStateLock(path, func() error {
		if err := removeMockTemps(path); err != nil {
			return err
		}
		st, err := readMockFaults(path, machine)
		if err != nil {
			return err
		}
		change(st)
		data, err := encodeMockFaults(st)
		if err != nil {
			return err
		}
		f, err := writeFileAtomic(path, data)
		if err != nil {
			return err
		}
		return f.Close()
	})
	if err != nil {
		return fmt.Errorf("changing the faults of mock machine %s: %w", machine, err)
	}
	return nil
}

// readMockFaults reads a faults file; a machine never given a fault has
// none yet.
func readMockFaults(path, machine string) (*mockFaultState, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return newMockFaultState(machine), nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading mock machine faults: %w", err)
	}
	return decodeMockFaults(path, machine, data)
}

func newMockFaultState(machine string) *mockFaultState {
	return &mockFaultState{Version: mockFaultsVersion, Machine: machine, Events: []mockEvent{}}
}

func encodeMockFaults(st *mockFaultState) ([]byte, error) {
	data, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encoding mock machine faults: %w", err)
	}
	return append(data, '\n'), nil
}

func decodeMockFaults(path, machine string, data []byte) (*mockFaultState, error) {
	var st mockFaultState
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&st); err != nil {
		return nil, fmt.Errorf("mock machine faults %s are damaged (delete the file to clear them): %w", path, err)
	}
	if st.Version != mockFaultsVersion {
		return nil, fmt.Errorf("mock machine faults %s have version %d, want %d", path, st.Version, mockFaultsVersion)
	}
	if st.Machine != machine {
		return nil, fmt.Errorf("mock machine faults %s are of machine %q, not %q", path, st.Machine, machine)
	}
	return &st, nil
}
