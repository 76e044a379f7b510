package main

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"

	"sigs.k8s.io/yaml"

	gpuapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev/nvmock"
)

// checkNVML refuses an --nvml the demo's nodes cannot run, before the
// cluster starts: both simulate their GPUs (the real node has device
// nodes for 8 GPUs and no kernel driver), so only go-nvml's mock machines
// work.
func checkNVML(value string) error {
	machine, ok := strings.CutPrefix(value, "mock:")
	if !ok || !slices.Contains(nvmock.Machines(), machine) {
		var want []string
		for _, m := range nvmock.Machines() {
			want = append(want, "mock:"+m)
		}
		return fmt.Errorf("--nvml=%q: the demo's node simulates its GPUs; want one of %s", value, strings.Join(want, ", "))
	}
	return nil
}

// readNodeConfig reads a NodeConfig file as the plugin would (strictly,
// validated) and returns it as the chart's kubeletPlugin.nodeConfig value:
// its fields without apiVersion and kind, which the chart writes itself.
func readNodeConfig(path string) (map[string]any, error) {
	var data []byte
	if path != "" { // "": no file, every GPU whole, as the plugin does
		var err error
		if data, err = os.ReadFile(path); err != nil {
			return nil, fmt.Errorf("--node-config: %w", err)
		}
	}
	cfg, err := gpuapi.DecodeNodeConfig(data)
	if err != nil {
		return nil, fmt.Errorf("--node-config %s: %w", path, err)
	}
	raw, err := json.Marshal(cfg)
	if err != nil {
		return nil, fmt.Errorf("--node-config %s: %w", path, err)
	}
	var out map[string]any
	if err := json.Unmarshal(raw, &out); err != nil {
		return nil, fmt.Errorf("--node-config %s: %w", path, err)
	}
	delete(out, "apiVersion")
	delete(out, "kind")
	return out, nil
}

// withMachine sets the plugin's simulated machine (--nvml) and node
// configuration (--node-config) in the real node's chart values, which
// otherwise always describe the 8 x H100 layout of demo/node-config.yaml.
// On the simulated NVML library (the framework's values run the plugin on
// --nvml real) the machine is the library's GPUAAS_MOCK_NVML_MACHINE;
// otherwise the plugin's in-process mock is --nvml itself.
// The chart merges nodeConfig into its defaults key by key, so a file
// without gpus offers every GPU whole, as the plugin does with that file.
// The controller publishes HardwareProfiles per tenant, as the simulated
// node's does (startController): the queueing scenario's dashboard step
// installs their CRD.
func withMachine(values, nvml string, nodeConfig map[string]any) (string, error) {
	var v map[string]any
	if err := yaml.Unmarshal([]byte(values), &v); err != nil {
		return "", fmt.Errorf("reading the chart values: %w", err)
	}
	ctrl, _ := v["controller"].(map[string]any)
	if ctrl == nil {
		ctrl = map[string]any{}
		v["controller"] = ctrl
	}
	ctrl["hardwareProfilesPerTenant"] = true
	kp, _ := v["kubeletPlugin"].(map[string]any)
	if kp == nil {
		kp = map[string]any{}
		v["kubeletPlugin"] = kp
	}
	if kp["nvmlBackend"] == "real" {
		if err := setLibraryMachine(v, strings.TrimPrefix(nvml, "mock:")); err != nil {
			return "", err
		}
	} else {
		kp["nvmlBackend"] = nvml
	}
	kp["nodeConfig"] = nodeConfig
	out, err := yaml.Marshal(v)
	if err != nil {
		return "", fmt.Errorf("writing the chart values: %w", err)
	}
	return string(out), nil
}

// setLibraryMachine sets GPUAAS_MOCK_NVML_MACHINE among the values'
// extraEnv, where the framework names the library's machine.
func setLibraryMachine(v map[string]any, machine string) error {
	env, _ := v["extraEnv"].([]any)
	for _, e := range env {
		if m, ok := e.(map[string]any); ok && m["name"] == "GPUAAS_MOCK_NVML_MACHINE" {
			m["value"] = machine
			return nil
		}
	}
	return fmt.Errorf("the chart values run the plugin on the simulated NVML library but name no GPUAAS_MOCK_NVML_MACHINE in extraEnv")
}
