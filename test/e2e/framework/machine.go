package framework

import (
	"path/filepath"

	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev/nvmock"
)

// SimulatedMachine is a node's simulated GPUs as a test acts on them
// from outside the plugin: the state directory where the mock backend, or
// the simulated libnvidia-ml.so.1, keeps the machine, which the test
// process writes directly (on the real node it is a host directory the
// plugin's container mounts), as hack/mocknvml and the tests' fault
// injections do. What it sets the plugin reads at its next NVML call,
// through either backend.
type SimulatedMachine struct {
	StateDir string
}

// Machine is the simulated machine of a kubelet-simulator node.
func (n *Node) Machine() SimulatedMachine {
	return SimulatedMachine{StateDir: filepath.Join(n.PluginDataDir, "mock-nvml")}
}

// Machine is the simulated machine of the real node, in the directory the
// chart gives the plugin (MOCK_NVML_STATE_DIR, or GPUAAS_MOCK_NVML_STATE_DIR
// for the simulated library: ChartValues).
func (n *RealNode) Machine() SimulatedMachine {
	return SimulatedMachine{StateDir: filepath.Join(n.KubeletDir, "plugins", DriverName, "mock-nvml")}
}

// SetGPUUse sets what a GPU (index or UUID) is doing: nvmock.SetGPUUse.
func (m SimulatedMachine) SetGPUUse(gpu string, use nvmock.GPUUse) error {
	return nvmock.SetGPUUse(m.StateDir, gpu, use)
}

// SetMIGUse sets what a MIG device (UUID) is doing: nvmock.SetMIGUse.
func (m SimulatedMachine) SetMIGUse(migUUID string, use nvmock.MIGUse) error {
	return nvmock.SetMIGUse(m.StateDir, migUUID, use)
}

// SetProcessUse runs a process on a GPU (index or UUID) or MIG device
// (UUID), or changes what it does: nvmock.SetProcessUse. On the real node
// a container's host PID makes the plugin find the container's pod.
func (m SimulatedMachine) SetProcessUse(device string, p nvmock.ProcessUse) error {
	return nvmock.SetProcessUse(m.StateDir, device, p)
}

// EndProcess ends a process on every device: nvmock.EndProcess.
func (m SimulatedMachine) EndProcess(pid uint32) error {
	return nvmock.EndProcess(m.StateDir, pid)
}

// SetUseSupported switches a GPU's use calls off (NOT_SUPPORTED) or on:
// nvmock.SetUseSupported.
func (m SimulatedMachine) SetUseSupported(gpu string, supported bool) error {
	return nvmock.SetUseSupported(m.StateDir, gpu, supported)
}
