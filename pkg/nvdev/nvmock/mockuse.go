package nvmock

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/gpuaas/gpu-dra-driver/pkg/mig/migtest"
)

// What the GPUs of a persistent mock machine are doing (their use) is
// state of the machine, in its state file, as MIG devices are: set from
// outside the plugin (hack/mocknvml use and proc, the e2e framework, unit
// tests), it outlives every process reading it. Per GPU: SM and memory
// utilization and memory used; per GPU instance (a MIG device's memory
// and SMs are its GPU instance's): SM activity and memory used; per
// process: the device it runs on, SM and memory utilization, memory used.
// NVML serves them as a real GPU does (mockusecalls.go, mockgpm.go):
//   - GetUtilizationRates (whole GPUs without MIG; NOT_SUPPORTED on MIG
//     device handles and on a GPU in MIG mode, as nvml.h says);
//   - GetMemoryInfo and GetMemoryInfo_v2 (used from the state, free the
//     rest), on GPUs and MIG devices;
//   - GetComputeRunningProcesses (a MIG device lists only its own
//     processes, with their GPU and compute instance IDs; a whole GPU
//     lists all) and GetProcessUtilization (whole GPUs without MIG: one
//     sample per process with some utilization, none for an idle one, as
//     nvml.h says; ERROR_NOT_FOUND when no sample is newer than the last
//     seen);
//   - GPM (Hopper on): the SM activity of a GPU or a GPU instance between
//     two samples.
//
// What a GPU reports is at least what its processes add up to: its SM and
// memory utilization are the larger of the values set and the sum of its
// processes' (at most 100), its memory used the larger of the value set
// and its processes' and instances' memory. A process ended (EndProcess)
// is gone from every list, as a PID the sampler saw a moment ago may be
// gone by the time it reads /proc.
//
// A reboot ends every process and clears the use; a GPU reset
// (ResetGPU) refuses while processes run on the GPU, as nvidia-smi -r
// does, and clears the use.

// GPUUse is what a whole GPU is doing.
type GPUUse struct {
	// SMUtil is the percent of time one or more kernels ran
	// (nvmlUtilization_t.gpu), 0 to 100.
	SMUtil uint32
	// MemUtil is the percent of time device memory was read or written
	// (nvmlUtilization_t.memory), 0 to 100.
	MemUtil uint32
	// MemoryUsed is the device memory in use, in bytes.
	MemoryUsed uint64
}

// MIGUse is what a MIG device's GPU instance is doing.
type MIGUse struct {
	// SMActivity is the percent of the instance's SMs busy, 0 to 100, as
	// GPM measures it between two samples.
	SMActivity uint32
	// MemoryUsed is the instance's memory in use, in bytes.
	MemoryUsed uint64
}

// ProcessUse is what one process is doing on a GPU or a MIG device.
type ProcessUse struct {
	PID uint32
	// Name is what SystemGetProcessName answers for it; empty answers
	// ERROR_NOT_FOUND.
	Name string
	// SMUtil and MemUtil are its share of the GPU's time, 0 to 100, as
	// GetProcessUtilization samples them.
	SMUtil, MemUtil uint32
	// MemoryUsed is its device memory, in bytes (ProcessInfo.UsedGpuMemory).
	MemoryUsed uint64
}

// mockUseState is a GPU's or a GPU instance's use in the state file: the
// values set, and its GPM counter: SMBusy is the integral of its SM
// activity (percent times seconds) up to Since, the last change of the
// activity, from which the counter at any later time follows.
type mockUseState struct {
	SMUtil     uint32    `json:"smUtil,omitempty"`
	MemUtil    uint32    `json:"memUtil,omitempty"`
	MemoryUsed uint64    `json:"memoryUsed,omitempty"`
	Since      time.Time `json:"since"`
	SMBusy     float64   `json:"smBusy,omitempty"`
}

// mockProcessState is a process on a GPU in the state file. A process on
// the whole GPU has WholeGPU as its instance IDs, as NVML lists it.
type mockProcessState struct {
	PID               uint32 `json:"pid"`
	Name              string `json:"name,omitempty"`
	GpuInstanceID     uint32 `json:"gpuInstanceID"`
	ComputeInstanceID uint32 `json:"computeInstanceID"`
	SMUtil            uint32 `json:"smUtil,omitempty"`
	MemUtil           uint32 `json:"memUtil,omitempty"`
	MemoryUsed        uint64 `json:"memoryUsed,omitempty"`
}

// SetGPUUse sets what a GPU (an index or a UUID) of the persistent mock
// machine in dir is doing, in every process using the machine.
func SetGPUUse(dir, gpu string, use GPUUse) error {
	if err := checkPercents(use.SMUtil, use.MemUtil); err != nil {
		return err
	}
	ref, err := findMockGPU(dir, gpu)
	if err != nil {
		return err
	}
	return changeUse(dir, ref.machine, ref.uuid, func(g *mockGPUState) error {
		u := g.Use
		u.SMUtil, u.MemUtil, u.MemoryUsed = use.SMUtil, use.MemUtil, use.MemoryUsed
		return nil
	})
}

// SetMIGUse sets what the GPU instance of a MIG device (its UUID) of the
// persistent mock machine in dir is doing. The use lasts as long as the
// instance: a new MIG device starts idle.
func SetMIGUse(dir, migUUID string, use MIGUse) error {
	if err := checkPercents(use.SMActivity); err != nil {
		return err
	}
	ref, err := findMockMIG(dir, migUUID)
	if err != nil {
		return err
	}
	return changeUse(dir, ref.machine, ref.uuid, func(g *mockGPUState) error {
		gi, err := giState(g, ref.gi)
		if err != nil {
			return err
		}
		gi.Use.SMUtil, gi.Use.MemoryUsed = use.SMActivity, use.MemoryUsed
		return nil
	})
}

// SetProcessUse runs a process on a device of the persistent mock machine
// in dir: a GPU (an index or a UUID) or a MIG device (its UUID), or
// changes what it does there. A process may run on several devices, each
// set on its own.
func SetProcessUse(dir, device string, p ProcessUse) error {
	if p.PID == 0 {
		return errors.New("a process needs a process ID")
	}
	if err := checkPercents(p.SMUtil, p.MemUtil); err != nil {
		return err
	}
	ref, err := findMockDevice(dir, device)
	if err != nil {
		return err
	}
	return changeUse(dir, ref.machine, ref.uuid, func(g *mockGPUState) error {
		if ref.gi != WholeGPU {
			if _, err := giState(g, ref.gi); err != nil {
				return err
			}
		}
		proc := mockProcessState{PID: p.PID, Name: p.Name, GpuInstanceID: ref.gi, ComputeInstanceID: ref.ci,
			SMUtil: p.SMUtil, MemUtil: p.MemUtil, MemoryUsed: p.MemoryUsed}
		if i := slices.IndexFunc(g.Processes, proc.sameDevice); i >= 0 {
			g.Processes[i] = proc
			return nil
		}
		g.Processes = append(g.Processes, proc)
		return nil
	})
}

// EndProcess ends a process on every device of every persistent mock
// machine in dir: NVML lists it no more. It fails if no device runs it.
func EndProcess(dir string, pid uint32) error {
	states, err := mockMachineStates(dir)
	if err != nil {
		return err
	}
	found := false
	for _, st := range states {
		for _, g := range st.GPUs {
			if !slices.ContainsFunc(g.Processes, func(p mockProcessState) bool { return p.PID == pid }) {
				continue
			}
			found = true
			err := changeUse(dir, st.Machine, g.UUID, func(g *mockGPUState) error {
				g.Processes = slices.DeleteFunc(g.Processes, func(p mockProcessState) bool { return p.PID == pid })
				if len(g.Processes) == 0 {
					g.Processes = nil
				}
				return nil
			})
			if err != nil {
				return err
			}
		}
	}
	if !found {
		return fmt.Errorf("no process %d on the mock machines in %s", pid, dir)
	}
	return nil
}

// SetUseSupported makes the use calls of a GPU (an index or a UUID) of
// the persistent mock machine in dir, and of its MIG devices, answer
// ERROR_NOT_SUPPORTED (supported false), as on a GPU or driver without
// them, or answer again: GetUtilizationRates, GetMemoryInfo_v2,
// GetProcessUtilization, the GPM samples (GpmQueryDeviceSupport then says
// unsupported). GetMemoryInfo and GetComputeRunningProcesses, which every
// driver has, keep answering. It is a fault: ClearFaults ends it.
func SetUseSupported(dir, gpu string, supported bool) error {
	return changeGPUFaults(dir, gpu, func(g *mockGPUFaults) { g.UseUnsupported = !supported })
}

func checkPercents(ps ...uint32) error {
	for _, p := range ps {
		if p > 100 {
			return fmt.Errorf("a utilization is a percent, 0 to 100, not %d", p)
		}
	}
	return nil
}

func (p mockProcessState) sameDevice(q mockProcessState) bool {
	return p.PID == q.PID && p.GpuInstanceID == q.GpuInstanceID && p.ComputeInstanceID == q.ComputeInstanceID
}

// mockDeviceRef is a GPU or a MIG device named from outside the plugin:
// gi and ci are WholeGPU for a whole GPU.
type mockDeviceRef struct {
	mockGPURef
	gi, ci uint32
}

// findMockDevice finds a GPU (an index or a UUID) or a MIG device (its
// UUID) in the machines of a state directory.
func findMockDevice(dir, device string) (mockDeviceRef, error) {
	if strings.HasPrefix(device, "MIG-") {
		return findMockMIG(dir, device)
	}
	ref, err := findMockGPU(dir, device)
	if err != nil {
		return mockDeviceRef{}, err
	}
	return mockDeviceRef{mockGPURef: ref, gi: WholeGPU, ci: WholeGPU}, nil
}

// findMockMIG finds a MIG device by UUID in the machines of a state
// directory, from the instances the state holds (its UUID follows from
// its GPU's and its instance IDs, migtest.MigUUID).
func findMockMIG(dir, migUUID string) (mockDeviceRef, error) {
	states, err := mockMachineStates(dir)
	if err != nil {
		return mockDeviceRef{}, err
	}
	for _, st := range states {
		for _, g := range st.GPUs {
			for _, gi := range g.GIs {
				for _, ci := range gi.CIs {
					if migtest.MigUUID(g.UUID, int(gi.ID), int(ci.ID)) == migUUID {
						return mockDeviceRef{mockGPURef: mockGPURef{machine: st.Machine, uuid: g.UUID}, gi: gi.ID, ci: ci.ID}, nil
					}
				}
			}
		}
	}
	return mockDeviceRef{}, fmt.Errorf("no MIG device %q on the mock machines in %s", migUUID, dir)
}

func giState(g *mockGPUState, id uint32) (*mockGIState, error) {
	i := slices.IndexFunc(g.GIs, func(gi mockGIState) bool { return gi.ID == id })
	if i < 0 {
		return nil, fmt.Errorf("GPU %s has no GPU instance %d (any more)", g.UUID, id)
	}
	return &g.GIs[i], nil
}

// changeUse changes the use of one GPU in its machine's state file. The
// GPM counters of the GPU and its instances are settled first, at the
// activity before the change, so that a sample taken before the change
// and one after it measure the activity in between.
func changeUse(dir, machine, uuid string, change func(*mockGPUState) error) error {
	err := rewriteMockState(StatePath(dir, machine), func(st *mockState) error {
		i := slices.IndexFunc(st.GPUs, func(g mockGPUState) bool { return g.UUID == uuid })
		if i < 0 {
			return fmt.Errorf("no GPU %s in the state", uuid)
		}
		g := &st.GPUs[i]
		settleUse(g, time.Now())
		return change(g)
	})
	if err != nil {
		return fmt.Errorf("changing the use of GPU %s: %w", uuid, err)
	}
	return nil
}

// settleUse brings the GPM counters of a GPU and its instances up to now,
// giving each one that has none.
func settleUse(g *mockGPUState, now time.Time) {
	v := useViewOf(g)
	g.Use = settled(g.Use, v.gpuSM(), now)
	for i := range g.GIs {
		gi := &g.GIs[i]
		gi.Use = settled(gi.Use, v.giSM(gi.ID), now)
	}
}

func settled(u *mockUseState, sm uint32, now time.Time) *mockUseState {
	out := mockUseState{Since: now}
	if u != nil {
		out = *u
		out.SMBusy, out.Since = u.busyAt(sm, now), now
	}
	return &out
}

// busyAt is the GPM counter at t of a GPU or instance whose activity has
// been sm since its last change.
func (u *mockUseState) busyAt(sm uint32, t time.Time) float64 {
	if u == nil {
		return 0
	}
	return u.SMBusy + float64(sm)*max(t.Sub(u.Since).Seconds(), 0)
}
