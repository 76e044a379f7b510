// Command inventory prints the devices dra-kubelet-plugin would publish on
// this machine, without a cluster: NVML discovery (the real library, or a
// mock machine) and the plugin's own inventory and slice building, rendered
// as the ResourceSlices' device lists. hack/compare-real-gpu.sh prints it
// beside nvidia-smi on a machine with a GPU. It changes nothing on the
// GPUs: no MIG mode change, no instance created.
package main

import (
	"flag"
	"fmt"
	"os"

	"k8s.io/klog/v2"
	"sigs.k8s.io/yaml"

	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin"
)

func main() {
	backend := flag.String("nvml", nvdev.BackendReal, "NVML backend: real, or mock:<machine>")
	driverRoot := flag.String("driver-root", "/", "root of the NVIDIA driver installation")
	nodeConfig := flag.String("node-config", "", "node configuration file (kind NodeConfig); empty offers every GPU whole")
	nodeName := flag.String("node-name", "this-node", "node (and pool) name")
	klog.InitFlags(nil)
	flag.Parse()
	if err := run(*backend, *driverRoot, *nodeConfig, *nodeName); err != nil {
		fmt.Fprintln(os.Stderr, "inventory:", err)
		os.Exit(1)
	}
}

func run(backend, driverRoot, nodeConfig, nodeName string) error {
	cfg := &configapi.NodeConfig{}
	if nodeConfig != "" {
		data, err := os.ReadFile(nodeConfig)
		if err != nil {
			return fmt.Errorf("reading node configuration: %w", err)
		}
		if cfg, err = configapi.DecodeNodeConfig(data); err != nil {
			return fmt.Errorf("%s: %w", nodeConfig, err)
		}
	}
	lib, err := nvdev.Open(nvdev.Options{Backend: backend, DriverRoot: driverRoot, MockSeed: nodeName})
	if err != nil {
		return fmt.Errorf("opening NVML: %w", err)
	}
	defer func() { _ = lib.Shutdown() }()
	inv := plugin.Discover(klog.Background(), lib, cfg)
	out, err := yaml.Marshal(plugin.Resources(nodeName, inv))
	if err != nil {
		return fmt.Errorf("rendering the devices: %w", err)
	}
	fmt.Printf("# %d devices, %d counter sets\n%s", len(inv.Devices), len(inv.CounterSets), out)
	return nil
}
