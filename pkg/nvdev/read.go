package nvdev

import (
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

// readGPU collects one GPU's attributes. Calls that only some GPUs or
// drivers support (multiprocessor count, NUMA node) degrade to "unknown"
// rather than failing the whole node.
func readGPU(d device.Device, topo Topology) (GPU, error) {
	var g GPU
	var ret nvml.Return
	if g.Index, ret = d.GetIndex(); ret != nvml.SUCCESS {
		return g, fmt.Errorf("getting index: %w", ret)
	}
	if g.Minor, ret = d.GetMinorNumber(); ret != nvml.SUCCESS {
		return g, fmt.Errorf("getting minor number: %w", ret)
	}
	if g.UUID, ret = d.GetUUID(); ret != nvml.SUCCESS {
		return g, fmt.Errorf("getting UUID: %w", ret)
	}
	if g.ProductName, ret = d.GetName(); ret != nvml.SUCCESS {
		return g, fmt.Errorf("getting name: %w", ret)
	}
	mem, ret := d.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return g, fmt.Errorf("getting memory info: %w", ret)
	}
	g.MemoryBytes = mem.Total
	if err := readStrings(d, &g); err != nil {
		return g, err
	}
	if err := readMig(d, &g); err != nil {
		return g, err
	}
	g.Multiprocessors = readMultiprocessors(d)
	return g, readTopology(d, topo, &g)
}

// readStrings reads the attributes go-nvlib already turns into strings.
func readStrings(d device.Device, g *GPU) error {
	var err error
	if g.Brand, err = d.GetBrandAsString(); err != nil {
		return fmt.Errorf("getting brand: %w", err)
	}
	if g.Architecture, err = d.GetArchitectureAsString(); err != nil {
		return fmt.Errorf("getting architecture: %w", err)
	}
	if g.CUDAComputeCapability, err = d.GetCudaComputeCapabilityAsString(); err != nil {
		return fmt.Errorf("getting compute capability: %w", err)
	}
	return nil
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
	busID, err := d.GetPCIBusID()
	if err != nil {
		return fmt.Errorf("getting PCI bus ID: %w", err)
	}
	g.PCIBusID = normalizeBusID(busID)
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
