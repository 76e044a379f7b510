package nvdev

import (
	"errors"
	"fmt"
	"strings"

	"github.com/NVIDIA/go-nvlib/pkg/nvlib/device"
	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

func readSystem(lib nvml.Interface) (SystemInfo, error) {
	driver, ret := lib.SystemGetDriverVersion()
	if ret != nvml.SUCCESS {
		return SystemInfo{}, fmt.Errorf("getting driver version: %w", ret)
	}
	cuda, ret := lib.SystemGetCudaDriverVersion()
	if ret != nvml.SUCCESS {
		return SystemInfo{}, fmt.Errorf("getting CUDA driver version: %w", ret)
	}
	// NVML encodes CUDA 12.4 as 12040.
	return SystemInfo{
		DriverVersion:     driver,
		CUDADriverVersion: fmt.Sprintf("%d.%d", cuda/1000, (cuda%1000)/10),
	}, nil
}

// unknownValue is what a brand or architecture newer than go-nvlib reads
// as (go-nvlib's own word for BRAND_UNKNOWN).
const unknownValue = "Unknown"

// readGPU collects one GPU's attributes. Calls that only some GPUs or
// drivers support (multiprocessor count, NUMA node) degrade to "unknown"
// rather than failing the whole node, and so do a brand or architecture
// newer than go-nvlib (unknown says which): the GPU works, only the
// attribute cannot be named. The UUID is read first so that a GPU failing
// later is still named.
func readGPU(d device.Device, topo Topology) (g GPU, unknown, err error) {
	var ret nvml.Return
	if g.UUID, ret = d.GetUUID(); ret != nvml.SUCCESS {
		return g, nil, fmt.Errorf("getting UUID: %w", ret)
	}
	if busID, err := d.GetPCIBusID(); err == nil {
		g.PCIBusID = normalizeBusID(busID)
	}
	if g.Index, ret = d.GetIndex(); ret != nvml.SUCCESS {
		return g, nil, fmt.Errorf("getting index: %w", ret)
	}
	if g.Minor, ret = d.GetMinorNumber(); ret != nvml.SUCCESS {
		return g, nil, fmt.Errorf("getting minor number: %w", ret)
	}
	if g.ProductName, ret = d.GetName(); ret != nvml.SUCCESS {
		return g, nil, fmt.Errorf("getting name: %w", ret)
	}
	mem, ret := d.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return g, nil, fmt.Errorf("getting memory info: %w", ret)
	}
	g.MemoryBytes = mem.Total
	if unknown, err = readStrings(d, &g); err != nil {
		return g, nil, err
	}
	if err := readMig(d, &g); err != nil {
		return g, nil, err
	}
	g.Multiprocessors = readMultiprocessors(d)
	return g, unknown, readTopology(d, topo, &g)
}

// readStrings reads the attributes go-nvlib turns into strings. A brand or
// architecture NVML answers but go-nvlib cannot name is Unknown, and said
// so in unknown; a call NVML refuses is an error.
func readStrings(d device.Device, g *GPU) (unknown, err error) {
	brand, ret := d.GetBrand()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("getting brand: %w", ret)
	}
	if g.Brand, err = d.GetBrandAsString(); err != nil {
		g.Brand = unknownValue
		unknown = errors.Join(unknown, fmt.Errorf("brand %d is unknown to go-nvlib", brand))
	}
	arch, ret := d.GetArchitecture()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("getting architecture: %w", ret)
	}
	if g.Architecture, err = d.GetArchitectureAsString(); err != nil {
		g.Architecture = unknownValue
		unknown = errors.Join(unknown, fmt.Errorf("architecture %d is unknown to go-nvlib", arch))
	}
	if g.CUDAComputeCapability, err = d.GetCudaComputeCapabilityAsString(); err != nil {
		return nil, fmt.Errorf("getting compute capability: %w", err)
	}
	return unknown, nil
}

func readMig(d device.Device, g *GPU) error {
	var err error
	if g.MigCapable, err = d.IsMigCapable(); err != nil {
		return fmt.Errorf("getting MIG capability: %w", err)
	}
	if !g.MigCapable {
		return nil
	}
	if g.MigEnabled, err = d.IsMigEnabled(); err != nil {
		return fmt.Errorf("getting MIG mode: %w", err)
	}
	return nil
}

// readMultiprocessors asks NVML for the SM count; older drivers answer only
// for MIG devices, in which case the capacity is left out, not guessed.
func readMultiprocessors(d device.Device) int {
	attrs, ret := d.GetAttributes()
	if ret != nvml.SUCCESS {
		return 0
	}
	return int(attrs.MultiprocessorCount)
}

func readTopology(d device.Device, topo Topology, g *GPU) error {
	if g.PCIBusID == "" {
		busID, err := d.GetPCIBusID()
		if err != nil {
			return fmt.Errorf("getting PCI bus ID: %w", err)
		}
		g.PCIBusID = normalizeBusID(busID)
	}
	g.NUMANode = -1
	if node, ret := d.GetNumaNodeId(); ret == nvml.SUCCESS {
		g.NUMANode = node
	} else if node, err := topo.NUMANode(g.PCIBusID); err == nil {
		g.NUMANode = node
	}
	if root, err := topo.PCIeRoot(g.PCIBusID); err == nil {
		g.PCIeRoot = root
	}
	return nil
}

// normalizeBusID turns NVML's "00000000:3B:00.0" into the extended BDF form
// Kubernetes' pciBusID attribute expects: "0000:3b:00.0".
func normalizeBusID(id string) string {
	id = strings.ToLower(id)
	domain, rest, ok := strings.Cut(id, ":")
	if !ok {
		return id
	}
	if len(domain) > 4 {
		domain = domain[len(domain)-4:]
	}
	return domain + ":" + rest
}
