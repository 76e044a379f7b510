package nvmock

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxb200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"github.com/google/uuid"
	"github.com/gpuaas/gpu-dra-driver/pkg/mig/migtest"
)

// mockMachines are go-nvml's simulated 8-GPU machines.
var mockMachines = map[string]func() *server.Server{
	"dgxa100": dgxa100.New,
	"dgxb200": dgxb200.New,
	"dgxh100": dgxh100.New,
	"dgxh200": dgxh200.New,
}

// Machines lists the names accepted after "mock:".
func Machines() []string {
	names := make([]string, 0, len(mockMachines))
	for n := range mockMachines {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// smCounts are the published multiprocessor counts of the mocked products;
// go-nvml's mock has no GetAttributes for whole GPUs.
var smCounts = map[string]int{
	"A100": 108,
	"H100": 132,
	"H200": 132,
	"B200": 148,
}

// New returns a go-nvml mock machine completed with what its devices
// lack for our device model: a PCI bus ID, a NUMA node, an SM count, and
// UUIDs that stay the same across restarts for the same seed (a real GPU's
// UUID never changes; go-nvml draws random ones). Kept in memory, its GPUs
// answer the use calls (mockuse.go) as idle.
func New(machine, seed string) (*server.Server, error) {
	s, err := newMachine(machine, seed)
	if err != nil {
		return nil, err
	}
	completeUse(s, idleUse{}, nil)
	return s, nil
}

// newMachine is New without the use calls, which a persistent machine
// answers from its state file.
func newMachine(machine, seed string) (*server.Server, error) {
	newServer, ok := mockMachines[machine]
	if !ok {
		return nil, fmt.Errorf("unknown mock machine %q, want one of %v", machine, Machines())
	}
	s := newServer()
	s.EventSetCreateFunc = quietEventSet
	// No process uses a GPU of a machine kept in memory; a persistent one
	// lists what mocknvml hold injects (mockmigmode.go).
	s.SystemGetProcessNameFunc = func(int) (string, nvml.Return) { return "", nvml.ERROR_NOT_FOUND }
	for _, d := range s.Devices {
		completeMockDevice(d.(*server.Device), machine, seed)
	}
	// MIG device handles and NVML's refusals (overlapping placements, too
	// many instances), so dynamic MIG behaves as on a real GPU.
	migtest.CompleteMock(s)
	completeMemoryLimits(s)
	return s, nil
}

func completeMockDevice(d *server.Device, machine, seed string) {
	d.UUID = "GPU-" + uuid.NewSHA1(uuid.NameSpaceOID, fmt.Appendf(nil, "%s/%s/%d", seed, machine, d.Index)).String()
	// Spread the GPUs as on a DGX: eight PCIe switches, two NUMA nodes.
	d.PciBusID = fmt.Sprintf("0000:%02x:00.0", 0x18+0x20*d.Index)
	cfg := d.Config
	d.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
		bus := uint32(0x18 + 0x20*d.Index)
		info := nvml.PciInfo{PciDeviceId: cfg.PciDeviceId, Bus: bus}
		// As NVML writes them (NVML_DEVICE_PCI_BUS_ID_FMT and its legacy
		// form): go-nvlib before v0.12, which NVIDIA's DRA plugin vendors,
		// strips "0000" from busId without looking, so a 4-digit domain
		// there reads as ":18:00.0".
		copy(info.BusId[:], toInt8(fmt.Sprintf("%08X:%02X:00.0", 0, bus)))
		copy(info.BusIdLegacy[:], toInt8(fmt.Sprintf("%04X:%02X:00.0", 0, bus)))
		return info, nvml.SUCCESS
	}
	d.GetNumaNodeIdFunc = func() (int, nvml.Return) { return d.Index / 4, nvml.SUCCESS }
	d.GetAttributesFunc = func() (nvml.DeviceAttributes, nvml.Return) {
		return nvml.DeviceAttributes{
			MultiprocessorCount: uint32(mockSMCount(cfg.Name)),
			MemorySizeMB:        cfg.MemoryMB,
		}, nvml.SUCCESS
	}
	completeComputeMode(d)
	completeEvents(d)
	d.GetGpuInstanceByIdFunc = func(id int) (nvml.GpuInstance, nvml.Return) {
		d.RLock()
		defer d.RUnlock()
		for gi := range d.GpuInstances {
			if int(gi.Info.Id) == id {
				return gi, nvml.SUCCESS
			}
		}
		return nil, nvml.ERROR_NOT_FOUND
	}
}

// mockEventTypes are the NVML events a mock GPU supports, as a data-center
// GPU does.
const mockEventTypes = nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError | nvml.EventTypeSingleBitEccError

// completeEvents lets the health monitor register on a mock GPU as on a
// real one. On a machine kept in memory nothing can inject faults, so its
// event sets never deliver; a persistent machine replaces these with sets
// that deliver what mocknvml injects (mockfaults.go).
func completeEvents(d *server.Device) {
	d.GetSupportedEventTypesFunc = func() (uint64, nvml.Return) { return mockEventTypes, nvml.SUCCESS }
	d.RegisterEventsFunc = func(uint64, nvml.EventSet) nvml.Return { return nvml.SUCCESS }
	// Row remapping (Ampere on): nothing corrected, nothing pending.
	d.GetRemappedRowsFunc = func() (int, int, bool, bool, nvml.Return) { return 0, 0, false, false, nvml.SUCCESS }
}

// quietEventSet is an event set on which nothing ever happens.
func quietEventSet() (nvml.EventSet, nvml.Return) {
	return &mock.EventSet{
		WaitFunc: func(timeoutMs uint32) (nvml.EventData, nvml.Return) {
			time.Sleep(time.Duration(timeoutMs) * time.Millisecond)
			return nvml.EventData{}, nvml.ERROR_TIMEOUT
		},
		FreeFunc: func() nvml.Return { return nvml.SUCCESS },
	}, nvml.SUCCESS
}

// completeComputeMode keeps the compute mode the plugin sets for MPS, as
// a real GPU does.
func completeComputeMode(d *server.Device) {
	mode := nvml.COMPUTEMODE_DEFAULT
	d.SetComputeModeFunc = func(m nvml.ComputeMode) nvml.Return {
		d.Lock()
		defer d.Unlock()
		mode = m
		return nvml.SUCCESS
	}
	d.GetComputeModeFunc = func() (nvml.ComputeMode, nvml.Return) {
		d.RLock()
		defer d.RUnlock()
		return mode, nvml.SUCCESS
	}
}

func mockSMCount(name string) int {
	for product, n := range smCounts {
		if strings.Contains(name, product) {
			return n
		}
	}
	return 0
}

func toInt8(s string) []int8 {
	out := make([]int8, len(s))
	for i := range len(s) {
		out[i] = int8(s[i])
	}
	return out
}

// mockTopology derives the PCIe root from the bus number: one root per bus
// range, the same shape as the mock's bus IDs.
type mockTopology struct{}

func (mockTopology) PCIeRoot(busID string) (string, error) {
	var domain, bus int
	if _, err := fmt.Sscanf(busID, "%x:%x:", &domain, &bus); err != nil {
		return "", fmt.Errorf("parsing PCI bus ID %q: %w", busID, err)
	}
	return fmt.Sprintf("pci%04x:%02x", domain, bus-1), nil
}

func (mockTopology) NUMANode(string) (int, error) { return -1, fmt.Errorf("no sysfs for mock GPUs") }

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
