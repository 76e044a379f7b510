package nvmock

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"k8s.io/klog/v2"
)

// A persistent mock machine's GPUs fail when someone outside the plugin
// says so (mocknvml xid, ecc, lost, mig-destroy-fails), the way a real
// GPU fails whatever the plugin does. What is injected lives in a faults
// file beside the state file, so that the health monitor meets the
// failures through the same NVML calls as on a real node:
//   - events (XIDs, ECC errors) go to an append-only log, numbered; an
//     event set delivers those logged after its devices registered;
//   - a lost GPU (fallen off the bus) answers GetMemoryInfo and
//     GetTemperature with ERROR_GPU_IS_LOST, and losing it logs XID 79;
//     NVML hands out no new handle of it either (DeviceGetHandleByIndex
//     and ByUUID answer GPU_IS_LOST, as nvidia-smi's "Unable to determine
//     the device handle for GPU ...: GPU is lost" shows), so a process
//     started after the loss meets it while enumerating;
//   - MIG instance creation may be slow (CreateDelay), as on real GPUs,
//     where making a GPU instance takes about a second: a restore that
//     makes dozens again takes minutes;
//   - a GPU of an unknown generation answers GetBrand and GetArchitecture
//     with values newer than go-nvlib knows, as a new product does with
//     a driver newer than the plugin;
//   - a GPU whose MIG instances cannot be destroyed (a process still holds
//     them) answers Destroy with ERROR_IN_USE;
//   - MIG mode changes may be refused while a process holds the GPU, stay
//     pending a reset, or re-bind the GPU with a new minor number
//     (mockmigmode.go).
//   - a GPU (or driver) without the use calls answers them, on the GPU
//     and its MIG devices, with ERROR_NOT_SUPPORTED (SetUseSupported,
//     mockuse.go); a lost GPU answers them ERROR_GPU_IS_LOST.
//
// The file is not part of the machine's state: a fault is not something
// the plugin does, and keeping it apart lets an injection never wait for,
// or race with, a plugin changing MIG devices.

// mockFaultsVersion is bumped on any incompatible change of the file.
const mockFaultsVersion = 1

const (
	// mockFaultsSuffix names the faults file; it does not start with
	// mockStatePrefix, so it is never taken for a machine's state.
	mockFaultsSuffix = ".faults.json"
	// maxMockEvents bounds the log: a consumer further behind than that
	// loses the oldest events, as NVML's own event queue overflows.
	maxMockEvents = 256
	// mockEventPoll is how often a waiting event set rereads the file.
	mockEventPoll = 50 * time.Millisecond
	// mockTemperatureC is what a healthy mock GPU's sensor reads.
	mockTemperatureC = 40
	// xidGPULost is the XID the driver reports for a GPU that has fallen
	// off the bus.
	xidGPULost = 79
)

// WholeGPU is the GPU and compute instance ID of an event that is not
// scoped to a MIG device, as NVML reports it.
const WholeGPU uint32 = 0xFFFFFFFF

type mockFaultState struct {
	Version int    `json:"version"`
	Machine string `json:"machine"`
	// LastSeq is the seq of the last event ever logged, kept apart from
	// the log so that numbers are never reused when the log is trimmed.
	LastSeq uint64                   `json:"lastSeq"`
	Events  []mockEvent              `json:"events"`
	GPUs    map[string]mockGPUFaults `json:"gpus,omitempty"`
	// CreateDelay is how long making a GPU instance takes, on every GPU.
	CreateDelay time.Duration `json:"createDelay,omitempty"`
}

type mockEvent struct {
	Seq       uint64 `json:"seq"`
	GPU       string `json:"gpu"`
	EventType uint64 `json:"eventType"`
	// Data is the XID for an XID event.
	Data              uint64    `json:"data"`
	GpuInstanceID     uint32    `json:"gpuInstanceID"`
	ComputeInstanceID uint32    `json:"computeInstanceID"`
	Time              time.Time `json:"time"`
}

// mockGPUFaults are a GPU's standing faults; a GPU with none has no entry.
type mockGPUFaults struct {
	Lost            bool `json:"lost,omitempty"`
	MigDestroyFails bool `json:"migDestroyFails,omitempty"`
	// RowRemapPending: an uncorrectable memory error left a row to be
	// remapped at the next reset (nvmlDeviceGetRemappedRows isPending).
	RowRemapPending bool `json:"rowRemapPending,omitempty"`
	// UnknownGeneration: the GPU's brand and architecture are newer than
	// go-nvlib knows (mockUnknownBrand, mockUnknownArchitecture).
	UnknownGeneration bool `json:"unknownGeneration,omitempty"`
	// MIG mode changes (mockmigmode.go): MigModeInUse is how many more
	// of them answer ERROR_IN_USE; Holders are processes using the GPU,
	// which refuse them all while there; MigModePending leaves them
	// pending a reset; RebindOnMigMode gives the GPU a new minor number
	// at each one.
	MigModeInUse    int       `json:"migModeInUse,omitempty"`
	Holders         []Process `json:"holders,omitempty"`
	MigModePending  bool      `json:"migModePending,omitempty"`
	RebindOnMigMode bool      `json:"rebindOnMigMode,omitempty"`
	// UseUnsupported: the GPU's use calls answer ERROR_NOT_SUPPORTED
	// (SetUseSupported).
	UseUnsupported bool `json:"useUnsupported,omitempty"`
}

// What a GPU of an unknown generation answers: values past every one
// NVML's headers (and so go-nvlib) name today.
const (
	mockUnknownBrand        nvml.BrandType          = 99
	mockUnknownArchitecture nvml.DeviceArchitecture = 99
)

// FaultsPath is the faults file of a mock machine in a state directory.
func FaultsPath(dir, machine string) string {
	return filepath.Join(dir, machine+mockFaultsSuffix)
}

// InjectEvent logs an NVML event (nvml.EventTypeXidCriticalError with
// the XID as data, nvml.EventTypeDoubleBitEccError, ...) on a GPU of the
// persistent mock machine in dir, named by index or UUID. gi and ci scope
// it to a MIG device; WholeGPU for both means the whole GPU. Event
// sets of every process on the machine deliver it.
func InjectEvent(dir, gpu string, eventType, data uint64, gi, ci uint32) error {
	if eventType&(eventType-1) != 0 || eventType&mockEventTypes == 0 {
		return fmt.Errorf("event type %#x is not one of the event types a mock GPU supports (%#x)", eventType, uint64(mockEventTypes))
	}
	ref, err := findMockGPU(dir, gpu)
	if err != nil {
		return err
	}
	return updateMockFaults(dir, ref.machine, func(st *mockFaultState) {
		st.log(mockEvent{GPU: ref.uuid, EventType: eventType, Data: data, GpuInstanceID: gi, ComputeInstanceID: ci})
	})
}

// SetGPULost makes a GPU of the persistent mock machine in dir fall off
// the bus (lost) or come back. Falling off logs XID 79, once, as the
// driver reports it.
func SetGPULost(dir, gpu string, lost bool) error {
	ref, err := findMockGPU(dir, gpu)
	if err != nil {
		return err
	}
	return updateMockFaults(dir, ref.machine, func(st *mockFaultState) {
		st.setGPU(ref.uuid, func(g *mockGPUFaults) {
			if lost && !g.Lost {
				st.log(mockEvent{GPU: ref.uuid, EventType: nvml.EventTypeXidCriticalError, Data: xidGPULost,
					GpuInstanceID: WholeGPU, ComputeInstanceID: WholeGPU})
			}
			g.Lost = lost
		})
	})
}

// SetMigDestroyFails makes the GPU and compute instances of a GPU of
// the persistent mock machine in dir refuse to be destroyed, as when a
// process still uses them, or lets them be destroyed again.
func SetMigDestroyFails(dir, gpu string, fails bool) error {
	return changeGPUFaults(dir, gpu, func(g *mockGPUFaults) { g.MigDestroyFails = fails })
}

// SetRowRemapPending makes a GPU of the persistent mock machine in dir
// report a row remapping pending (what a reset would apply), or not.
func SetRowRemapPending(dir, gpu string, pending bool) error {
	return changeGPUFaults(dir, gpu, func(g *mockGPUFaults) { g.RowRemapPending = pending })
}

// SetUnknownGeneration makes a GPU of the persistent mock machine in
// dir answer a brand and an architecture newer than go-nvlib knows, or its
// own again.
func SetUnknownGeneration(dir, gpu string, unknown bool) error {
	return changeGPUFaults(dir, gpu, func(g *mockGPUFaults) { g.UnknownGeneration = unknown })
}

// SetCreateDelay makes creating a GPU instance on the persistent mock
// machines in dir take d (zero: at once), in every process using them.
func SetCreateDelay(dir string, d time.Duration) error {
	states, err := mockMachineStates(dir)
	if err != nil {
		return err
	}
	for _, st := range states {
		if err := updateMockFaults(dir, st.Machine, func(f *mockFaultState) { f.CreateDelay = d }); err != nil {
			return err
		}
	}
	return nil
}

// ClearFaults ends every standing fault of the persistent mock machines
// in dir. The event log stays, so event numbers keep increasing and no
// event set delivers an event twice.
func ClearFaults(dir string) error {
	states, err := mockMachineStates(dir)
	if err != nil {
		return err
	}
	for _, st := range states {
		if err := updateMockFaults(dir, st.Machine, func(f *mockFaultState) { f.GPUs = nil }); err != nil {
			return err
		}
	}
	return nil
}

// mockFaults is a persistent mock machine's view of its faults file in one
// process: the file as last read, and the event sets made here.
type mockFaults struct {
	path, machine string

	mu sync.Mutex // guards below; never held while taking a set's lock
	// held is the file last read, kept open so that its inode is not
	// reused and comparing it with the path tells reliably whether
	// another process replaced it (as mockMachine does with its state).
	held *os.File
	st   *mockFaultState // what held holds; never changed, only replaced
	sets map[*mock.EventSet]*mockEventSet
	// bindingOf is a GPU's binding now (mockhandle.go): a registration
	// made at another one delivers nothing. Set once, before any call.
	bindingOf func(uuid string) int
}

func newMockFaults(dir, machine string) *mockFaults {
	return &mockFaults{path: FaultsPath(dir, machine), machine: machine, sets: map[*mock.EventSet]*mockEventSet{}}
}

func (f *mockFaults) report(err error) {
	klog.Background().Error(err, "Persistent mock NVML machine faults", "machine", f.machine, "faults", f.path)
}

// current returns the faults as the file holds them now, reading it again
// only if another process replaced it. The result must not be changed.
func (f *mockFaults) current() (*mockFaultState, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	onDisk, err := os.Stat(f.path)
	if errors.Is(err, fs.ErrNotExist) {
		f.forgetLocked()
		return newMockFaultState(f.machine), nil
	}
	if err != nil {
		return nil, fmt.Errorf("checking mock machine faults: %w", err)
	}
	if f.held != nil {
		held, err := f.held.Stat()
		if err != nil {
			return nil, fmt.Errorf("checking mock machine faults: %w", err)
		}
		if os.SameFile(onDisk, held) {
			return f.st, nil
		}
	}
	return f.reloadLocked()
}

func (f *mockFaults) reloadLocked() (*mockFaultState, error) {
	file, err := os.Open(f.path)
	if err != nil {
		return nil, fmt.Errorf("opening mock machine faults: %w", err)
	}
	data, err := io.ReadAll(file)
	if err != nil {
		_ = file.Close()
		return nil, fmt.Errorf("reading mock machine faults: %w", err)
	}
	st, err := decodeMockFaults(f.path, f.machine, data)
	if err != nil {
		_ = file.Close()
		return nil, err
	}
	f.forgetLocked()
	f.held, f.st = file, st
	return st, nil
}

func (f *mockFaults) forgetLocked() {
	if f.held != nil {
		_ = f.held.Close()
	}
	f.held, f.st = nil, nil
}

// gpuFaults returns a GPU's standing faults; false, after logging why, if
// the file cannot be read, which the call then answers with ERROR_UNKNOWN.
func (f *mockFaults) gpuFaults(uuid string) (mockGPUFaults, bool) {
	st, err := f.current()
	if err != nil {
		f.report(err)
		return mockGPUFaults{}, false
	}
	return st.GPUs[uuid], true
}

// reachable is what a call that needs the GPU itself answers before
// doing its work.
func (f *mockFaults) reachable(uuid string) nvml.Return {
	g, ok := f.gpuFaults(uuid)
	switch {
	case !ok:
		return nvml.ERROR_UNKNOWN
	case g.Lost:
		return nvml.ERROR_GPU_IS_LOST
	}
	return nvml.SUCCESS
}

// wrapServer makes the machine's events, probes and MIG teardown follow
// the faults file. It wraps what mockMachine.wrapServer has wrapped.
func (f *mockFaults) wrapServer(s *server.Server) {
	s.EventSetCreateFunc = f.createEventSet
	s.SystemGetProcessNameFunc = f.processName
	for _, dev := range s.Devices {
		f.wrapDevice(dev.(*server.Device))
	}
	byUUID := s.DeviceGetHandleByUUIDFunc
	s.DeviceGetHandleByUUIDFunc = func(id string) (nvml.Device, nvml.Return) {
		d, ret := byUUID(id)
		if gpu, ok := d.(*server.Device); ok && ret == nvml.SUCCESS {
			if ret := f.reachable(gpu.UUID); ret != nvml.SUCCESS {
				return nil, ret
			}
		}
		return f.guardMigHandle(d), ret
	}
	byIndex := s.DeviceGetHandleByIndexFunc
	s.DeviceGetHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) {
		d, ret := byIndex(i)
		if gpu, ok := d.(*server.Device); ok && ret == nvml.SUCCESS {
			if ret := f.reachable(gpu.UUID); ret != nvml.SUCCESS {
				return nil, ret
			}
		}
		return d, ret
	}
	shutdown := s.ShutdownFunc
	s.ShutdownFunc = func() nvml.Return {
		f.mu.Lock()
		f.forgetLocked()
		f.mu.Unlock()
		return shutdown()
	}
}

func (f *mockFaults) wrapDevice(d *server.Device) {
	d.GetSupportedEventTypesFunc = func() (uint64, nvml.Return) { return mockEventTypes, nvml.SUCCESS }
	d.RegisterEventsFunc = func(types uint64, set nvml.EventSet) nvml.Return { return f.register(d, types, set) }
	f.wrapHolders(d)
	getMem := d.GetMemoryInfoFunc
	d.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
		if ret := f.reachable(d.UUID); ret != nvml.SUCCESS {
			return nvml.Memory{}, ret
		}
		return getMem()
	}
	d.GetTemperatureFunc = func(sensor nvml.TemperatureSensors) (uint32, nvml.Return) {
		if sensor != nvml.TEMPERATURE_GPU {
			return 0, nvml.ERROR_INVALID_ARGUMENT
		}
		if ret := f.reachable(d.UUID); ret != nvml.SUCCESS {
			return 0, ret
		}
		return mockTemperatureC, nvml.SUCCESS
	}
	d.GetRemappedRowsFunc = func() (int, int, bool, bool, nvml.Return) {
		if ret := f.reachable(d.UUID); ret != nvml.SUCCESS {
			return 0, 0, false, false, ret
		}
		g, _ := f.gpuFaults(d.UUID)
		return 0, 0, g.RowRemapPending, false, nvml.SUCCESS
	}
	migByIndex := d.GetMigDeviceHandleByIndexFunc
	d.GetMigDeviceHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) {
		m, ret := migByIndex(i)
		return f.guardMigHandle(m), ret
	}
	// The delay is outside the machine's lock (the wrapped function takes
	// it): a slow create on one GPU does not stall calls on the others.
	createGI := d.CreateGpuInstanceWithPlacementFunc
	d.CreateGpuInstanceWithPlacementFunc = func(info *nvml.GpuInstanceProfileInfo, pl *nvml.GpuInstancePlacement) (nvml.GpuInstance, nvml.Return) {
		if st, err := f.current(); err == nil && st.CreateDelay > 0 {
			time.Sleep(st.CreateDelay)
		}
		return createGI(info, pl)
	}
	getBrand, getArch := d.GetBrandFunc, d.GetArchitectureFunc
	d.GetBrandFunc = func() (nvml.BrandType, nvml.Return) {
		if g, _ := f.gpuFaults(d.UUID); g.UnknownGeneration {
			return mockUnknownBrand, nvml.SUCCESS
		}
		return getBrand()
	}
	d.GetArchitectureFunc = func() (nvml.DeviceArchitecture, nvml.Return) {
		if g, _ := f.gpuFaults(d.UUID); g.UnknownGeneration {
			return mockUnknownArchitecture, nvml.SUCCESS
		}
		return getArch()
	}
}

// guardMigHandle makes a MIG device handle's memory probe fail while its
// GPU is lost: the MIG device is on the GPU that fell off the bus. Whole
// GPUs (*server.Device) are guarded by wrapDevice.
func (f *mockFaults) guardMigHandle(dev nvml.Device) nvml.Device {
	md, ok := dev.(*mock.Device)
	if !ok || md.GetMemoryInfoFunc == nil || md.GetDeviceHandleFromMigDeviceHandleFunc == nil {
		return dev
	}
	parent, ret := md.GetDeviceHandleFromMigDeviceHandle()
	p, ok := parent.(*server.Device)
	if ret != nvml.SUCCESS || !ok {
		return dev
	}
	getMem := md.GetMemoryInfoFunc
	md.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
		if ret := f.reachable(p.UUID); ret != nvml.SUCCESS {
			return nvml.Memory{}, ret
		}
		return getMem()
	}
	return md
}

// guardDestroy makes an instance's Destroy refuse, changing nothing, while
// its GPU's MIG teardown is set to fail. It wraps every GPU and compute
// instance the machine adopts (made here, by another process, or restored
// from the state file), so the refusal does not depend on who made it.
func (f *mockFaults) guardDestroy(gpu nvml.Device, destroy *func() nvml.Return) {
	d, ok := gpu.(*server.Device)
	if !ok {
		return
	}
	next := *destroy
	*destroy = func() nvml.Return {
		g, ok := f.gpuFaults(d.UUID)
		switch {
		case !ok:
			return nvml.ERROR_UNKNOWN
		case g.MigDestroyFails:
			return nvml.ERROR_IN_USE
		}
		return next()
	}
}
