// Package nvdev is the only place that talks to NVML. It opens one long-lived
// NVML session, enumerates the node's GPUs once with every attribute the
// device model needs, and caches their handles. The same code runs on the real
// library and on go-nvml's mock machines (package nvmock, which registers
// them as a Backend).
package nvdev

import (
	"errors"
	"fmt"
	"sync"

	"github.com/NVIDIA/go-nvlib/pkg/nvlib/device"
	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// ErrLibraryNotFound is returned when the NVML library cannot be loaded, for
// example on a node without the NVIDIA driver or with a wrong driver root.
var ErrLibraryNotFound = errors.New("NVML library not found")

// SystemInfo is what is common to every GPU of the node.
type SystemInfo struct {
	DriverVersion     string // e.g. "550.54.15"
	CUDADriverVersion string // e.g. "12.4"
}

// GPU is one physical GPU with the attributes of the device model.
type GPU struct {
	Index                 int
	Minor                 int
	UUID                  string
	ProductName           string
	Brand                 string
	Architecture          string
	CUDAComputeCapability string // "major.minor"
	MemoryBytes           uint64
	Multiprocessors       int    // 0 when NVML cannot tell
	PCIBusID              string // extended BDF, "0000:3b:00.0"
	PCIeRoot              string // "pci0000:3a", "" when unknown
	NUMANode              int    // -1 when the GPU has no NUMA affinity
	MigCapable            bool
	MigEnabled            bool
}

// Interface is what the rest of the driver sees of NVML.
type Interface interface {
	// System returns driver-wide information.
	System() SystemInfo
	// GPUs returns the GPUs found when the session was opened, by index.
	GPUs() []GPU
	// Problems returns the GPUs that could not be read completely when the
	// session was opened: one bad GPU (fallen off the bus, of a brand or
	// architecture go-nvlib does not know) must not hide the others, so
	// enumeration goes on past it and the plugin reports it instead.
	Problems() []Problem
	// DeviceByUUID returns the cached NVML handle of a GPU.
	DeviceByUUID(uuid string) (nvml.Device, error)
	// ForgetHandle drops the cached handle of a GPU, so that the next
	// DeviceByUUID asks NVML again: a GPU the driver re-bound (after a
	// MIG mode change, or mig-manager's) may leave the old handle stale
	// (see WithHandle).
	ForgetHandle(uuid string)
	// NVML returns the underlying library, for NVIDIA packages (nvcdi, MIG)
	// that take an nvml.Interface.
	NVML() nvml.Interface
	// Shutdown ends the NVML session.
	Shutdown() error
}

// Topology resolves what NVML does not know about a GPU's place on the
// PCIe tree; the real one reads sysfs, the mock one is synthetic.
type Topology interface {
	PCIeRoot(pciBusID string) (string, error)
	NUMANode(pciBusID string) (int, error)
}

// Problem is a GPU that enumeration could not read completely.
type Problem struct {
	Index int
	// UUID is "" when NVML could not tell it (a GPU that fell off the bus
	// answers no handle at all).
	UUID string
	// PCIBusID is "" when NVML could not tell it.
	PCIBusID string
	// Lost: NVML answered GPU_IS_LOST, the GPU fell off the bus (XID 79).
	Lost bool
	// Published: the GPU is among GPUs() nonetheless, with what could not
	// be read left at "Unknown" (a brand or architecture newer than
	// go-nvlib). Otherwise the GPU is left out of GPUs().
	Published bool
	Err       error
}

// Reason is a short machine-readable cause, for metrics and events.
func (p Problem) Reason() string {
	switch {
	case p.Lost:
		return "gpu-lost"
	case p.Published:
		return "unknown-attribute"
	}
	return "unreadable"
}

func (p Problem) String() string {
	id := fmt.Sprintf("GPU %d", p.Index)
	if p.UUID != "" {
		id += " (" + p.UUID + ")"
	}
	if p.Published {
		return fmt.Sprintf("%s is published with attributes unknown: %v", id, p.Err)
	}
	return fmt.Sprintf("%s cannot be read and is not published: %v", id, p.Err)
}

// session implements Interface over any nvml.Interface.
type session struct {
	lib      nvml.Interface
	system   SystemInfo
	gpus     []GPU
	problems []Problem
	mu       sync.Mutex
	handles  map[string]nvml.Device
	// closed, when set, runs once NVML is shut down (see OpenLibrary).
	closed func()
}

// initHint says what an operator can do about NVML's most common answers
// at start, the first thing a node with a broken driver shows.
func initHint(ret nvml.Return) string {
	switch ret {
	case nvml.ERROR_DRIVER_NOT_LOADED:
		return " (the NVIDIA kernel module is not loaded on this node: is the driver installed and loaded, or the GPU Operator's driver pod ready?)"
	case nvml.ERROR_NO_PERMISSION:
		return " (no access to /dev/nvidiactl: the plugin's container must be privileged)"
	case nvml.ERROR_LIB_RM_VERSION_MISMATCH:
		return " (the loaded kernel module and the driver libraries are of different versions: reboot the node or reload the module after a driver upgrade)"
	}
	return ""
}

// open initialises NVML once and enumerates the GPUs.
func open(lib nvml.Interface, topo Topology) (*session, error) {
	if ret := lib.Init(); ret != nvml.SUCCESS {
		if ret == nvml.ERROR_LIBRARY_NOT_FOUND {
			return nil, ErrLibraryNotFound
		}
		return nil, InitError(ret)
	}
	s := &session{lib: lib, handles: map[string]nvml.Device{}}
	if err := s.enumerate(topo); err != nil {
		_ = lib.Shutdown()
		return nil, err
	}
	return s, nil
}

// skippedNames are the devices NVML lists that are no GPUs to offer, as
// go-nvlib's VisitDevices skips them.
var skippedNames = map[string]bool{"DGX Display": true, "NVIDIA DGX Display": true}

// enumerate reads every GPU. Only a failure of the driver as a whole (no
// system information, no device count) fails the session; a GPU that cannot
// be read is recorded as a Problem and the others are read on (go-nvlib's
// VisitDevices stops at the first bad GPU, which took the node down).
func (s *session) enumerate(topo Topology) error {
	sys, err := readSystem(s.lib)
	if err != nil {
		return err
	}
	s.system = sys
	count, ret := s.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return fmt.Errorf("getting GPU count: %w", ret)
	}
	devlib := device.New(s.lib)
	for i := range count {
		h, ret := s.lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			s.problems = append(s.problems, Problem{Index: i, Lost: ret == nvml.ERROR_GPU_IS_LOST,
				Err: fmt.Errorf("getting handle: %w", ret)})
			continue
		}
		if name, ret := h.GetName(); ret == nvml.SUCCESS && skippedNames[name] {
			continue
		}
		d, err := devlib.NewDevice(h)
		if err != nil {
			s.problems = append(s.problems, Problem{Index: i, Err: err})
			continue
		}
		gpu, unknown, err := readGPU(d, topo)
		if err != nil {
			s.problems = append(s.problems, problemOf(i, gpu, err))
			continue
		}
		if unknown != nil {
			s.problems = append(s.problems, Problem{Index: gpu.Index, UUID: gpu.UUID, PCIBusID: gpu.PCIBusID,
				Published: true, Err: unknown})
		}
		s.gpus = append(s.gpus, gpu)
		s.handles[gpu.UUID] = d
	}
	return nil
}

// problemOf describes a GPU whose reading failed, with what was read of it.
func problemOf(i int, g GPU, err error) Problem {
	p := Problem{Index: i, UUID: g.UUID, PCIBusID: g.PCIBusID, Err: err}
	var ret nvml.Return
	p.Lost = errors.As(err, &ret) && ret == nvml.ERROR_GPU_IS_LOST
	return p
}

func (s *session) System() SystemInfo   { return s.system }
func (s *session) GPUs() []GPU          { return s.gpus }
func (s *session) Problems() []Problem  { return s.problems }
func (s *session) NVML() nvml.Interface { return s.lib }

func (s *session) DeviceByUUID(uuid string) (nvml.Device, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if d, ok := s.handles[uuid]; ok {
		return d, nil
	}
	// MIG devices and GPUs that appeared later are looked up once and cached.
	d, ret := s.lib.DeviceGetHandleByUUID(uuid)
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("getting NVML handle of %s: %w", uuid, ret)
	}
	s.handles[uuid] = d
	return d, nil
}

func (s *session) ForgetHandle(uuid string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.handles, uuid)
}

func (s *session) Shutdown() error {
	ret := s.lib.Shutdown()
	if s.closed != nil {
		s.closed()
		s.closed = nil
	}
	if ret != nvml.SUCCESS {
		return fmt.Errorf("shutting down NVML: %w", ret)
	}
	return nil
}
