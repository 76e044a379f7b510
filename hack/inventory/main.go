// Command inventory prints the devices dra-kubelet-plugin would publish on
// this machine, without a cluster: NVML discovery (the real library, or a
// mock machine) and the plugin's own inventory and slice building, rendered
// as the ResourceSlices' device lists. With --checks it also prints what
// the plugin would meet on this machine's GPUs (checks.go): GPUs it cannot
// read, MIG modes and what holds each GPU, driver versions.
// hack/compare-real-gpu.sh prints both beside nvidia-smi on a machine with
// a GPU. It changes nothing on the GPUs: no MIG mode change, no reset, no
// instance created.
package main

import (
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/inventory"

	"k8s.io/klog/v2"
	"sigs.k8s.io/yaml"

	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
	_ "github.com/gpuaas/gpu-dra-driver/pkg/nvdev/nvmock" // the mock:<machine> backends
)

func main() {
	backend := flag.String("nvml", nvdev.BackendReal, "NVML backend: real, or mock:<machine>")
	driverRoot := flag.String("driver-root", "/", "root of the NVIDIA driver installation")
	nodeConfig := flag.String("node-config", "", "node configuration file (kind NodeConfig); empty offers every GPU whole")
	nodeName := flag.String("node-name", "this-node", "node (and pool) name")
	checks := flag.Bool("checks", false, "also print, as a second YAML document, what the plugin would meet on the GPUs (unreadable GPUs, MIG modes, processes on each GPU, driver versions)")
	healthFor := flag.Duration("health", 0, "also run the plugin's health monitor this long and print, as a further YAML document, whether it watches every GPU for XID events and the faults it found (0: not run)")
	mockStateDir := flag.String("mock-state-dir", "", "with --nvml mock:<machine>, the plugin's --mock-nvml-state-dir (a mock machine with its injected faults)")
	klog.InitFlags(nil)
	flag.Parse()
	opts := nvdev.Options{Backend: *backend, DriverRoot: *driverRoot, MockSeed: *nodeName, MockStateDir: *mockStateDir}
	if err := run(opts, *nodeConfig, *nodeName, *checks, *healthFor); err != nil {
		fmt.Fprintln(os.Stderr, "inventory:", err)
		os.Exit(1)
	}
}

func run(opts nvdev.Options, nodeConfig, nodeName string, checks bool, healthFor time.Duration) error {
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
	lib, err := nvdev.Open(opts)
	if err != nil {
		return fmt.Errorf("opening NVML: %w", err)
	}
	defer func() { _ = lib.Shutdown() }()
	inv := inventory.Discover(klog.Background(), lib, cfg)
	out, err := yaml.Marshal(inventory.Resources(nodeName, inv))
	if err != nil {
		return fmt.Errorf("rendering the devices: %w", err)
	}
	fmt.Printf("# %d devices, %d counter sets\n%s", len(inv.Devices), len(inv.CounterSets), out)
	if checks {
		if err := printDocument("what the plugin would meet on these GPUs (issue 25 items 1, 2, 4)", runChecks(lib, opts.DriverRoot)); err != nil {
			return err
		}
	}
	if healthFor > 0 {
		return printDocument("what the plugin's health monitor sees", runHealth(lib, healthFor))
	}
	return nil
}

// printDocument prints v as a further YAML document under a comment.
func printDocument(title string, v any) error {
	out, err := yaml.Marshal(v)
	if err != nil {
		return fmt.Errorf("rendering %s: %w", title, err)
	}
	fmt.Printf("---\n# %s\n%s", title, out)
	return nil
}
