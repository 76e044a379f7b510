package cdi

import (
	"fmt"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/nvidia-container-toolkit/pkg/lookup"
	"github.com/NVIDIA/nvidia-container-toolkit/pkg/nvcdi"
	"k8s.io/klog/v2"
	specs "tags.cncf.io/container-device-interface/specs-go"
)

// controlNodes are the device nodes every CUDA container needs besides its
// GPUs. nvcdi only lists those that exist as char devices on this host, so we
// add the missing ones by path and let the runtime resolve them.
var controlNodes = []string{"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}

// commonEdits computes the spec-level edits shared by all claims: driver
// files from nvcdi when a driver is installed, plus the control nodes.
func commonEdits(log klog.Logger, opts Options) (specs.ContainerEdits, error) {
	var edits specs.ContainerEdits
	version, why := installedDriver(log, opts)
	if why != "" {
		// Expected on the demo/e2e machine; once per process is enough.
		log.V(1).Info("No driver files in CDI specs, injecting device nodes and env only", "reason", why)
	} else {
		driver, err := driverEdits(log, opts)
		if err != nil {
			return edits, fmt.Errorf("driver %s under %q: %w", version, opts.DriverRoot, err)
		}
		edits = driver
	}
	edits.Env = withoutVisibleDevices(edits.Env)
	edits.DeviceNodes = withControlNodes(edits.DeviceNodes, devRootOf(opts))
	return edits, nil
}

// installedDriver returns the driver version NVML reports if the libraries of
// that version are under the driver root, or a reason why there are none.
func installedDriver(log klog.Logger, opts Options) (version, why string) {
	if opts.DriverRoot == "" {
		return "", "no driver root configured"
	}
	if opts.NVML == nil {
		return "", "no NVML to read the driver version from"
	}
	version, err := driverVersion(opts.NVML)
	if err != nil {
		return "", err.Error()
	}
	// The same locator nvcdi uses, so "found" here means nvcdi finds it too.
	libs := lookup.NewLibraryLocator(lookup.WithRoot(opts.DriverRoot), lookup.WithLogger(nvcdiLogger{log}))
	for _, lib := range []string{"libcuda.so.", "libnvidia-ml.so."} {
		if found, err := libs.Locate(lib + version); err == nil && len(found) > 0 {
			return version, ""
		}
	}
	return "", fmt.Sprintf("neither libcuda.so.%[1]s nor libnvidia-ml.so.%[1]s found under driver root %q", version, opts.DriverRoot)
}

func driverVersion(lib nvml.Interface) (string, error) {
	if ret := lib.Init(); ret != nvml.SUCCESS {
		return "", fmt.Errorf("NVML init: %w", ret)
	}
	// Init/Shutdown are reference counted by NVML: this pair does not shut
	// down the plugin's own session.
	defer func() { _ = lib.Shutdown() }()
	version, ret := lib.SystemGetDriverVersion()
	if ret != nvml.SUCCESS {
		return "", fmt.Errorf("NVML driver version: %w", ret)
	}
	return version, nil
}

// driverEdits asks nvcdi for the common edits of the installed driver:
// libraries, binaries, firmware, IPC sockets, control nodes and hooks.
func driverEdits(log klog.Logger, opts Options) (specs.ContainerEdits, error) {
	lib, err := nvcdi.New(nvcdiOptions(log, opts)...)
	if err != nil {
		return specs.ContainerEdits{}, fmt.Errorf("nvcdi: %w", err)
	}
	edits, err := lib.GetCommonEdits()
	if err != nil {
		return specs.ContainerEdits{}, fmt.Errorf("nvcdi common edits: %w", err)
	}
	if edits == nil || edits.ContainerEdits == nil {
		return specs.ContainerEdits{}, nil
	}
	return *edits.ContainerEdits, nil
}

func nvcdiOptions(log klog.Logger, opts Options) []nvcdi.Option {
	o := []nvcdi.Option{
		nvcdi.WithLogger(nvcdiLogger{log}),
		nvcdi.WithNvmlLib(opts.NVML),
		nvcdi.WithDriverRoot(opts.DriverRoot),
		nvcdi.WithDevRoot(devRootOf(opts)),
		// Explicit: "auto" would probe the platform through go-nvlib's
		// info lib, which looks for real driver files and /dev nodes.
		nvcdi.WithMode(nvcdi.ModeNvml),
		nvcdi.WithVendor(Vendor),
		nvcdi.WithClass(Class),
		// nvsandboxutils is a separate driver library that is dlopened;
		// NVML already gives nvcdi everything we need.
		nvcdi.WithFeatureFlags(nvcdi.FeatureDisableNvsandboxUtils),
	}
	if opts.CDIHookPath == "" {
		return append(o, nvcdi.WithDisabledHooks(nvcdi.AllHooks))
	}
	return append(o, nvcdi.WithNVIDIACDIHookPath(opts.CDIHookPath))
}

// withoutVisibleDevices drops nvcdi's NVIDIA_VISIBLE_DEVICES=void: each claim
// sets its own value at spec level.
func withoutVisibleDevices(env []string) []string {
	out := env[:0:0]
	for _, e := range env {
		if !strings.HasPrefix(e, visibleDevicesEnv+"=") {
			out = append(out, e)
		}
	}
	return out
}

func withControlNodes(nodes []*specs.DeviceNode, devRoot string) []*specs.DeviceNode {
	have := make(map[string]bool, len(nodes))
	for _, n := range nodes {
		have[n.Path] = true
	}
	for _, p := range controlNodes {
		if have[p] {
			continue
		}
		nodes = append(nodes, newDeviceNode(devRoot, p))
	}
	return nodes
}

// nvcdiLogger adapts klog to nvcdi's logger interface. nvcdi logs a lot at
// warning level for files that are simply absent, so everything but errors
// goes to verbosity levels.
type nvcdiLogger struct{ log klog.Logger }

func (l nvcdiLogger) Errorf(f string, a ...any)   { l.log.Error(nil, fmt.Sprintf(f, a...)) }
func (l nvcdiLogger) Warningf(f string, a ...any) { l.at(2, f, a) }
func (l nvcdiLogger) Infof(f string, a ...any)    { l.at(4, f, a) }
func (l nvcdiLogger) Debugf(f string, a ...any)   { l.at(5, f, a) }
func (l nvcdiLogger) Tracef(f string, a ...any)   { l.at(6, f, a) }

func (l nvcdiLogger) at(v int, f string, a []any) {
	if lv := l.log.V(v); lv.Enabled() {
		lv.Info(fmt.Sprintf(f, a...), "source", "nvcdi")
	}
}
