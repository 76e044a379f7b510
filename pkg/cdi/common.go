package cdi

import (
	"fmt"
	"slices"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/nvidia-container-toolkit/pkg/lookup"
	"github.com/NVIDIA/nvidia-container-toolkit/pkg/nvcdi"
	"k8s.io/klog/v2"
	specs "tags.cncf.io/container-device-interface/specs-go"
)

// commonEdits computes the spec-level edits shared by all claims: driver
// files from nvcdi when a driver is installed (version, or why not), and
// NVIDIA_VISIBLE_DEVICES=void. The control nodes nvcdi does not list are
// added at each write, when they exist (nodeChecker).
func commonEdits(log klog.Logger, opts Options, version, why string) (specs.ContainerEdits, error) {
	var edits specs.ContainerEdits
	if why != "" {
		// Expected on the demo/e2e machine; once per process is enough.
		log.V(1).Info("No driver files in CDI specs, injecting device nodes and env only", "reason", why)
	} else {
		if opts.CDIHookPath == "" {
			return edits, fmt.Errorf("driver %s found under %q but no %s to run in containers (set its host path, or %q to leave NVIDIA's hooks out): "+
				"without the hook's ldcache update no container could load libcuda.so.1", version, opts.DriverRoot, HookBinary, HooksDisabled)
		}
		driver, err := driverEdits(log, opts)
		if err != nil {
			return edits, fmt.Errorf("driver %s under %q: %w", version, opts.DriverRoot, err)
		}
		edits = driver
	}
	edits.Env = withVisibleDevicesVoid(edits.Env)
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
	if opts.CDIHookPath == HooksDisabled {
		return append(o, nvcdi.WithDisabledHooks(nvcdi.AllHooks))
	}
	return append(o, nvcdi.WithNVIDIACDIHookPath(opts.CDIHookPath))
}

// withVisibleDevicesVoid sets NVIDIA_VISIBLE_DEVICES=void once, as nvcdi's
// common edits do (and NVIDIA's DRA driver keeps), whether or not nvcdi ran.
//
// The variable cannot list a container's GPUs: a container may use devices
// of several claims, each claim has its own spec, and the runtime applies
// the env of all of them in order, the last value of a name winning. A
// claim's list therefore replaced the others', and named devices of the
// claim that the container did not get (a container may use one request
// of a claim). The same value in every spec merges to itself. "void" also
// keeps a legacy nvidia-container-runtime, where a node still runs one,
// from adding GPUs on top of CDI: CUDA images set NVIDIA_VISIBLE_DEVICES=all.
// Which devices a container holds is in its device nodes and, by name, in
// one variable per device (deviceEnvPrefix).
func withVisibleDevicesVoid(env []string) []string {
	out := slices.DeleteFunc(slices.Clone(env), func(e string) bool { return strings.HasPrefix(e, visibleDevicesEnv+"=") })
	return append(out, visibleDevicesEnv+"=void")
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
