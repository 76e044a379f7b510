package main

import (
	"cmp"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/gpuaas/gpu-dra-driver/pkg/mig"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
)

// checksReport is what issue 25 items 1, 2 and 4 would meet on this
// machine, read through NVML calls that change nothing (no MIG mode
// change, no reset, no instance created):
//   - item 1: whether the plugin's per-GPU read succeeds, or its report of
//     the GPU it leaves out or publishes with unknown attributes;
//   - item 2: each GPU's MIG mode, current and pending, whether its
//     architecture switches MIG mode without a reset, its minor number,
//     and the processes NVML sees on it (what makes SetMigMode answer
//     IN_USE);
//   - item 4: the driver version NVML reports beside the version of the
//     libnvidia-ml the driver root holds and of the loaded kernel module.
//
// Which processes hold /dev/nvidia* open (what blocks rmmod nvidia and
// nvidia-smi -r) is read from /proc by hack/compare-real-gpu.sh.
type checksReport struct {
	Driver      driverCheck `json:"driver"`
	GPUCount    string      `json:"gpuCount"`
	GPUProblems []string    `json:"gpuProblems"`
	GPUs        []gpuCheck  `json:"gpus"`
}

type driverCheck struct {
	NVMLDriverVersion string `json:"nvmlDriverVersion"`
	NVMLVersion       string `json:"nvmlVersion"`
	CUDADriverVersion string `json:"cudaDriverVersion"`
	// Library is libnvidia-ml.so.1 under the driver root, resolved to its
	// file, whose suffix is the version of the libraries installed there.
	Library        string `json:"library"`
	LibraryVersion string `json:"libraryVersion"`
	// KernelModule is the first line of /proc/driver/nvidia/version.
	KernelModule string `json:"kernelModule"`
	// Agree says whether NVML's driver version is the installed
	// libraries' (a driver upgraded under a running plugin differs).
	Agree string `json:"agree"`
}

type gpuCheck struct {
	Index int    `json:"index"`
	UUID  string `json:"uuid"`
	// PluginRead is "ok" or the plugin's report of the GPU (item 1).
	PluginRead           string        `json:"pluginRead"`
	Architecture         string        `json:"architecture"`
	MigModeCurrent       string        `json:"migModeCurrent"`
	MigModePending       string        `json:"migModePending"`
	SwitchesWithoutReset string        `json:"migSwitchesWithoutReset"`
	Minor                string        `json:"minor"`
	Processes            []processSeen `json:"processes"`
	ProcessesError       string        `json:"processesError,omitempty"`
}

type processSeen struct {
	PID  uint32 `json:"pid"`
	Name string `json:"name"`
}

// libraryPlaces are where distributions put libnvidia-ml.so.1 (the ones
// the plugin searches, pkg/nvdev).
var libraryPlaces = []string{"usr/lib64", "usr/lib/x86_64-linux-gnu", "usr/lib/aarch64-linux-gnu", "usr/lib", "lib64"}

func runChecks(lib nvdev.Interface, driverRoot string) checksReport {
	l := lib.NVML()
	r := checksReport{Driver: checkDriver(l, driverRoot), GPUProblems: []string{}}
	problems := map[int]nvdev.Problem{}
	for _, p := range lib.Problems() {
		problems[p.Index] = p
		r.GPUProblems = append(r.GPUProblems, p.String())
	}
	r.Driver.CUDADriverVersion = lib.System().CUDADriverVersion
	count, ret := l.DeviceGetCount()
	if ret != nvml.SUCCESS {
		r.GPUCount = "error: " + ret.Error()
		return r
	}
	r.GPUCount = fmt.Sprint(count)
	for i := range count {
		g := gpuCheck{Index: i, PluginRead: "ok", Processes: []processSeen{}}
		if p, ok := problems[i]; ok {
			g.PluginRead = p.String()
		}
		dev, ret := l.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			g.UUID = "error: " + ret.Error()
			r.GPUs = append(r.GPUs, g)
			continue
		}
		checkGPU(l, dev, &g)
		r.GPUs = append(r.GPUs, g)
	}
	return r
}

func checkGPU(l nvml.Interface, dev nvml.Device, g *gpuCheck) {
	g.UUID = answer(dev.GetUUID())
	arch, ret := dev.GetArchitecture()
	g.Architecture = cmp.Or(archNames[arch], fmt.Sprintf("unknown to this build (%d)", arch))
	if ret != nvml.SUCCESS {
		g.Architecture = "error: " + ret.Error()
	}
	current, pending, ret := dev.GetMigMode()
	switch ret {
	case nvml.SUCCESS:
		g.MigModeCurrent, g.MigModePending = modeName(current), modeName(pending)
	case nvml.ERROR_NOT_SUPPORTED:
		g.MigModeCurrent, g.MigModePending = "not MIG-capable", "not MIG-capable"
	default:
		g.MigModeCurrent, g.MigModePending = "error: "+ret.Error(), "error: "+ret.Error()
	}
	if toggles, err := mig.TogglesWithoutReset(dev); err != nil {
		g.SwitchesWithoutReset = "error: " + err.Error()
	} else {
		g.SwitchesWithoutReset = fmt.Sprint(toggles)
	}
	minor, ret := dev.GetMinorNumber()
	g.Minor = fmt.Sprint(minor)
	if ret != nvml.SUCCESS {
		g.Minor = "error: " + ret.Error()
	}
	procs, ret := dev.GetComputeRunningProcesses()
	if ret != nvml.SUCCESS {
		g.ProcessesError = ret.Error()
		return
	}
	for _, p := range procs {
		name, ret := l.SystemGetProcessName(int(p.Pid))
		if ret != nvml.SUCCESS {
			name = "(" + ret.Error() + ")"
		}
		g.Processes = append(g.Processes, processSeen{PID: p.Pid, Name: name})
	}
}

func checkDriver(l nvml.Interface, driverRoot string) driverCheck {
	d := driverCheck{
		NVMLDriverVersion: answer(l.SystemGetDriverVersion()),
		NVMLVersion:       answer(l.SystemGetNVMLVersion()),
		Library:           "not found under " + driverRoot,
	}
	for _, dir := range libraryPlaces {
		file, err := filepath.EvalSymlinks(filepath.Join(driverRoot, dir, "libnvidia-ml.so.1"))
		if err != nil {
			continue
		}
		d.Library = file
		d.LibraryVersion = strings.TrimPrefix(filepath.Base(file), "libnvidia-ml.so.")
		break
	}
	d.KernelModule = "not loaded (/proc/driver/nvidia/version not found)"
	if data, err := os.ReadFile("/proc/driver/nvidia/version"); err == nil {
		d.KernelModule = strings.TrimSpace(strings.SplitN(string(data), "\n", 2)[0])
	}
	d.Agree = fmt.Sprint(d.LibraryVersion != "" && d.LibraryVersion == d.NVMLDriverVersion)
	return d
}

var archNames = map[nvml.DeviceArchitecture]string{
	nvml.DEVICE_ARCH_VOLTA: "Volta", nvml.DEVICE_ARCH_TURING: "Turing", nvml.DEVICE_ARCH_AMPERE: "Ampere",
	nvml.DEVICE_ARCH_ADA: "Ada", nvml.DEVICE_ARCH_HOPPER: "Hopper", nvml.DEVICE_ARCH_BLACKWELL: "Blackwell",
	nvml.DEVICE_ARCH_RUBIN: "Rubin",
}

// answer is an NVML string answer, or its error.
func answer(s string, ret nvml.Return) string {
	if ret != nvml.SUCCESS {
		return "error: " + ret.Error()
	}
	return s
}

func modeName(mode int) string {
	if mode == nvml.DEVICE_MIG_ENABLE {
		return "enabled"
	}
	return "disabled"
}
