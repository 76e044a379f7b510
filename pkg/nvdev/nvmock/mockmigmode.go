package nvmock

import (
	"fmt"
	"path/filepath"
	"slices"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

// MIG mode changes on a persistent mock machine behave as on real GPUs,
// where nvmlDeviceSetMigMode is not always final (issue 25 item 2):
//   - while another process holds the GPU (dcgm-exporter, an MPS daemon,
//     the other plugin pod of a rolling update) the call answers
//     ERROR_IN_USE and changes nothing (mocknvml hold, or mig-mode-in-use
//     for the next N calls), and GetComputeRunningProcesses lists the
//     holders, as NVML lists the processes on a GPU;
//   - where the driver cannot reset the GPU at once (pass-through VMs,
//     Ampere) the call succeeds with activation status
//     ERROR_RESET_REQUIRED and the mode stays pending (GetMigMode's
//     pending differs from current) until a reset or a reboot makes it
//     current, or setting the current mode again cancels it
//     (mig-mode-pending);
//   - NVML's documentation says the call "may unbind or reset the device
//     ... attributes such as minor number might change. The caller ... is
//     expected to query such attributes again": with rebind-on-mig-mode
//     each change that takes effect re-binds the GPU: a new minor number,
//     handles obtained before stale and event registrations made before
//     deaf to the GPU (mockhandle.go).
// The pending mode and the minor are the GPU's state (the state file); the
// behaviours are faults (the faults file), injected from outside.

// Process is a process a mock GPU lists as using it.
type Process struct {
	PID  uint32 `json:"pid"`
	Name string `json:"name,omitempty"`
}

// setMigMode is SetMigMode on a persistent mock GPU.
func (m *mockMachine) setMigMode(g *mockGPU, mode int) (nvml.Return, nvml.Return) {
	if mode != nvml.DEVICE_MIG_ENABLE && mode != nvml.DEVICE_MIG_DISABLE {
		return nvml.ERROR_INVALID_ARGUMENT, nvml.ERROR_INVALID_ARGUMENT
	}
	// Outside the machine's lock: taking a refusal writes the faults file.
	if ret := m.faults.takeMigModeInUse(g.d.UUID); ret != nvml.SUCCESS {
		return ret, ret
	}
	activation := nvml.ERROR_UNKNOWN
	ret := m.change(func() nvml.Return {
		var r nvml.Return
		activation, r = m.setMigModeLocked(g, mode)
		return r
	})
	if ret == nvml.ERROR_UNKNOWN {
		activation = ret // not recorded, so undone
	}
	return activation, ret
}

// setMigModeLocked changes the mode as the GPU's faults allow; the caller
// holds the machine's lock.
func (m *mockMachine) setMigModeLocked(g *mockGPU, mode int) (nvml.Return, nvml.Return) {
	faults, ok := m.faults.gpuFaults(g.d.UUID)
	if !ok {
		return nvml.ERROR_UNKNOWN, nvml.ERROR_UNKNOWN
	}
	g.d.RLock()
	current := g.d.MigMode
	g.d.RUnlock()
	if mode == current {
		g.pending = nil // asking for the current mode cancels a pending change
		return nvml.SUCCESS, nvml.SUCCESS
	}
	if faults.MigModePending {
		g.pending = &mode
		return nvml.ERROR_RESET_REQUIRED, nvml.SUCCESS
	}
	activation, ret := g.setMigMode(mode)
	if ret != nvml.SUCCESS {
		return activation, ret
	}
	g.pending = nil
	if faults.RebindOnMigMode {
		m.rebindLocked(g)
	}
	return activation, ret
}

// migMode is GetMigMode on a persistent mock GPU: current and pending.
func (m *mockMachine) migMode(g *mockGPU) (int, int, nvml.Return) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.syncLocked(); err != nil {
		m.report(err)
		return 0, 0, nvml.ERROR_UNKNOWN
	}
	g.d.RLock()
	current := g.d.MigMode
	g.d.RUnlock()
	if g.pending != nil {
		return current, *g.pending, nvml.SUCCESS
	}
	return current, current, nvml.SUCCESS
}

// rebindLocked re-binds a GPU: a minor number no other GPU of the machine
// has and that differs from its own, and a new binding, which makes the
// handles and event registrations of the old one stale (mockhandle.go).
func (m *mockMachine) rebindLocked(g *mockGPU) {
	minors := make([]int, len(m.gpus))
	at := 0
	for i, other := range m.gpus {
		other.d.RLock()
		minors[i] = other.d.Minor
		other.d.RUnlock()
		if other == g {
			at = i
		}
	}
	g.d.Lock()
	g.d.Minor = nextMinor(minors, at)
	g.d.Unlock()
	g.binding++
}

// nextMinor is the minor number GPU at is re-bound with: the lowest that
// neither another GPU (minors, by position) nor it has now.
func nextMinor(minors []int, at int) int {
	used := map[int]bool{}
	for _, minor := range minors {
		used[minor] = true
	}
	next := 0
	for used[next] {
		next++
	}
	return next
}

// takeMigModeInUse answers ERROR_IN_USE for a MIG mode change while the
// GPU has holders, or while refusals are left to give (one is used up).
func (f *mockFaults) takeMigModeInUse(uuid string) nvml.Return {
	g, ok := f.gpuFaults(uuid)
	switch {
	case !ok:
		return nvml.ERROR_UNKNOWN
	case g.Lost:
		return nvml.ERROR_GPU_IS_LOST
	case len(g.Holders) > 0:
		return nvml.ERROR_IN_USE
	case g.MigModeInUse == 0:
		return nvml.SUCCESS
	}
	taken := false
	err := updateMockFaults(filepath.Dir(f.path), f.machine, func(st *mockFaultState) {
		st.setGPU(uuid, func(g *mockGPUFaults) {
			if g.MigModeInUse > 0 { // another process may have taken the last one
				g.MigModeInUse--
				taken = true
			}
		})
	})
	if err != nil {
		f.report(err)
		return nvml.ERROR_UNKNOWN
	}
	if taken {
		return nvml.ERROR_IN_USE
	}
	return nvml.SUCCESS
}

// wrapHolders makes a GPU list its holders as NVML lists the compute
// processes on a GPU (no MIG scope, no memory accounted).
func (f *mockFaults) wrapHolders(d *server.Device) {
	d.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
		if ret := f.reachable(d.UUID); ret != nvml.SUCCESS {
			return nil, ret
		}
		g, _ := f.gpuFaults(d.UUID)
		out := make([]nvml.ProcessInfo, 0, len(g.Holders))
		for _, p := range g.Holders {
			out = append(out, nvml.ProcessInfo{Pid: p.PID, GpuInstanceId: WholeGPU, ComputeInstanceId: WholeGPU})
		}
		return out, nvml.SUCCESS
	}
}

// processName is SystemGetProcessName: the name a holder was given.
func (f *mockFaults) processName(pid int) (string, nvml.Return) {
	st, err := f.current()
	if err != nil {
		f.report(err)
		return "", nvml.ERROR_UNKNOWN
	}
	for _, g := range st.GPUs {
		for _, p := range g.Holders {
			if int(p.PID) == pid && p.Name != "" {
				return p.Name, nvml.SUCCESS
			}
		}
	}
	return "", nvml.ERROR_NOT_FOUND
}

// SetMigModeInUse makes the next times MIG mode changes of a GPU of
// the persistent mock machine in dir answer ERROR_IN_USE (0: none).
func SetMigModeInUse(dir, gpu string, times int) error {
	if times < 0 {
		return fmt.Errorf("times must be 0 or more, not %d", times)
	}
	return changeGPUFaults(dir, gpu, func(g *mockGPUFaults) { g.MigModeInUse = times })
}

// SetHolder makes a process hold a GPU of the persistent mock machine
// in dir (hold) or let go of it. While any process holds it, the GPU lists
// them and refuses MIG mode changes with ERROR_IN_USE.
func SetHolder(dir, gpu string, p Process, hold bool) error {
	if p.PID == 0 {
		return fmt.Errorf("a holder needs a process ID")
	}
	ref, err := findMockGPU(dir, gpu)
	if err != nil {
		return err
	}
	return updateMockFaults(dir, ref.machine, func(st *mockFaultState) {
		st.setGPU(ref.uuid, func(g *mockGPUFaults) {
			g.Holders = slices.DeleteFunc(g.Holders, func(h Process) bool { return h.PID == p.PID })
			if hold {
				g.Holders = append(g.Holders, p)
			}
			if len(g.Holders) == 0 {
				g.Holders = nil
			}
		})
	})
}

// SetMigModePending makes MIG mode changes of a GPU of the persistent
// mock machine in dir wait for a reset (or take effect at once again).
func SetMigModePending(dir, gpu string, pending bool) error {
	return changeGPUFaults(dir, gpu, func(g *mockGPUFaults) { g.MigModePending = pending })
}

// SetRebindOnMigMode makes each MIG mode change of a GPU of the
// persistent mock machine in dir re-bind it with a new minor number, or
// keep its minor again.
func SetRebindOnMigMode(dir, gpu string, rebind bool) error {
	return changeGPUFaults(dir, gpu, func(g *mockGPUFaults) { g.RebindOnMigMode = rebind })
}

// ResetGPU resets one GPU of the persistent mock machine in dir, as
// nvidia-smi -r does: a pending MIG mode becomes current, MIG devices and
// the compute mode are lost, a pending row remapping is applied. Like
// nvidia-smi it refuses while a process holds the GPU.
func ResetGPU(dir, gpu string) error {
	ref, err := findMockGPU(dir, gpu)
	if err != nil {
		return err
	}
	faults, err := readMockFaults(FaultsPath(dir, ref.machine), ref.machine)
	if err != nil {
		return err
	}
	if holders := faults.GPUs[ref.uuid].Holders; len(holders) > 0 {
		return fmt.Errorf("GPU %s is in use by %d processes (first: pid %d %s); a reset needs them gone", ref.uuid, len(holders), holders[0].PID, holders[0].Name)
	}
	err = rewriteMockState(StatePath(dir, ref.machine), func(st *mockState) error {
		i := slices.IndexFunc(st.GPUs, func(g mockGPUState) bool { return g.UUID == ref.uuid })
		if i < 0 {
			return fmt.Errorf("no GPU %s in the state", ref.uuid)
		}
		g := &st.GPUs[i]
		if procs := useViewOf(g).alive(); len(procs) > 0 {
			return fmt.Errorf("GPU %s runs %d processes (first: pid %d %s); a reset needs them gone", ref.uuid, len(procs), procs[0].PID, procs[0].Name)
		}
		if g.PendingMigMode != nil {
			g.MigMode = *g.PendingMigMode
		}
		g.PendingMigMode, g.GIs, g.NextGIID, g.ComputeMode = nil, nil, 0, nvml.COMPUTEMODE_DEFAULT
		g.Use, g.Processes = nil, nil
		return nil
	})
	if err != nil {
		return fmt.Errorf("resetting GPU %s: %w", ref.uuid, err)
	}
	return updateMockFaults(dir, ref.machine, func(st *mockFaultState) {
		st.setGPU(ref.uuid, func(g *mockGPUFaults) { g.RowRemapPending = false })
	})
}
