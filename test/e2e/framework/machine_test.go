package framework

import (
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev/nvmock"
)

// What a test sets on a node's simulated machine is what the plugin's
// mock backend, opened on the state directory the node gives it, reads.
func TestSimulatedMachineSetsUse(t *testing.T) {
	n := &Node{PluginDataDir: t.TempDir()}
	lib, err := nvdev.Open(nvdev.Options{Backend: nvmock.Prefix + "dgxh100", MockSeed: "node-a", MockStateDir: n.Machine().StateDir})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lib.Shutdown() }()
	m := n.Machine()
	if err := m.SetGPUUse("1", nvmock.GPUUse{SMUtil: 70}); err != nil {
		t.Fatal(err)
	}
	if err := m.SetProcessUse("1", nvmock.ProcessUse{PID: 4242, SMUtil: 70, MemoryUsed: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	dev, err := lib.DeviceByUUID(lib.GPUs()[1].UUID)
	if err != nil {
		t.Fatal(err)
	}
	if u, ret := dev.GetUtilizationRates(); ret != nvml.SUCCESS || u.Gpu != 70 {
		t.Errorf("utilization %+v, %v; want 70%%", u, ret)
	}
	if err := m.EndProcess(4242); err != nil {
		t.Fatal(err)
	}
	if procs, ret := dev.GetComputeRunningProcesses(); ret != nvml.SUCCESS || len(procs) != 0 {
		t.Errorf("processes after the end: %+v, %v", procs, ret)
	}
	if err := m.SetUseSupported("1", false); err != nil {
		t.Fatal(err)
	}
	if _, ret := dev.GetUtilizationRates(); ret != nvml.ERROR_NOT_SUPPORTED {
		t.Errorf("utilization with the use calls off: %v", ret)
	}
}
