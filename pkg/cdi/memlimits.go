package cdi

import (
	"debug/elf"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	specs "tags.cncf.io/container-device-interface/specs-go"
)

// Per-container device-memory limits. NVIDIA's driver r615 and later
// enforce a limit per cgroup (nvmlDeviceSetMemoryLimits_v1, cgroup v2
// only, not on MIG devices), and NVIDIA's CDI hook apply-cuda-memory-limits
// (nvidia-container-toolkit v1.20.1, the hook binary the plugin installs)
// sets it while the runtime creates the container, from two variables of
// the container's environment, in MiB.
const (
	memoryLimitHookName = "apply-cuda-memory-limits"
	memoryRequestEnv    = "NVIDIA_GPU_MEMORY_REQUEST"
	memoryLimitEnv      = "NVIDIA_GPU_MEMORY_LIMIT"
	mebibyte            = 1 << 20
	memoryLimitDriver   = 615
	// DefaultCgroupRoot is where the host's cgroup hierarchy is mounted,
	// as the plugin (and the hook, on the host) sees it.
	DefaultCgroupRoot = "/sys/fs/cgroup"
)

// MemoryLimits says whether the specs this handler writes make the driver
// enforce a device's memory per container, and why not.
type MemoryLimits struct {
	Enforced bool
	// Cause names why they are not enforced, for a metric's label (one
	// of the Cause* constants); "" when they are.
	Cause string
	// Reason is why they are not enforced, in words; "" when they are.
	Reason string
}

// Why a node's specs carry no memory limits.
const (
	CauseHooksDisabled = "HooksDisabled"
	CauseNoDriverFiles = "NoDriverFiles"
	CauseDriverTooOld  = "DriverBeforeR615"
	CauseCgroupV1      = "CgroupNotV2"
	CauseStaticHook    = "HookCannotLoadNVML"
)

// MemoryLimits is whether the specs written now carry the memory-limit
// hook (for the driver the handler last discovered).
func (h *Handler) MemoryLimits() MemoryLimits { return h.driver.Load().memLimits }

// memoryLimitsOf decides whether the memory-limit hook can run, and so
// whether a spec may name it: the hook fails the container's creation on
// a cgroup v1 host, and the driver refuses the call before r615.
func memoryLimitsOf(opts Options, version, noDriver string) MemoryLimits {
	switch {
	case opts.CDIHookPath == HooksDisabled:
		return MemoryLimits{Cause: CauseHooksDisabled, Reason: "NVIDIA's CDI hooks are disabled (cdiHookPath " + HooksDisabled + ")"}
	case noDriver != "":
		return MemoryLimits{Cause: CauseNoDriverFiles, Reason: "no driver files in the CDI specs: " + noDriver}
	case driverMajor(version) < memoryLimitDriver:
		return MemoryLimits{Cause: CauseDriverTooOld,
			Reason: fmt.Sprintf("driver %s has no per-container memory limits (r%d and later have)", version, memoryLimitDriver)}
	}
	if why := hookLoadsNVML(hookAsThePluginSeesIt(opts)); why != "" && !nvmlHookUsable(opts.NVMLHook) {
		return MemoryLimits{Cause: CauseStaticHook, Reason: why}
	}
	if ok, why := cgroupV2(opts); !ok {
		return MemoryLimits{Cause: CauseCgroupV1, Reason: why}
	}
	return MemoryLimits{Enforced: true}
}

func driverMajor(version string) int {
	major, _, _ := strings.Cut(version, ".")
	n, err := strconv.Atoi(major)
	if err != nil {
		return 0
	}
	return n
}

// cgroupV2 reports whether the host's cgroup hierarchy is cgroup v2, as
// the hook checks it (statfs of its root), or why not.
func cgroupV2(opts Options) (bool, string) {
	if opts.CgroupV2 != nil {
		return opts.CgroupV2()
	}
	return StatCgroupV2(DefaultCgroupRoot)
}

// StatCgroupV2 reports whether root is a cgroup v2 file system, or why
// not: NVIDIA's hook refuses any other (a hybrid host mounts a tmpfs of
// v1 controllers there), failing the container.
func StatCgroupV2(root string) (bool, string) {
	var st unix.Statfs_t
	if err := unix.Statfs(root, &st); err != nil {
		return false, fmt.Sprintf("cannot tell the host's cgroup version: %v", err)
	}
	if st.Type != unix.CGROUP2_SUPER_MAGIC {
		return false, fmt.Sprintf("the host's cgroups are not v2 (%s is not cgroup2fs): the driver's memory limits need cgroup v2", root)
	}
	return true, ""
}

// hookAsThePluginSeesIt is where the plugin reads the host's hook: a
// host path under the host's driver root (the chart mounts a host's "/"
// at /host) at the same place under the plugin's driver root, where that
// exists; the plugin's own copy (InstallHook's, at the same path on both)
// otherwise. The plugin's /usr/bin/nvidia-cdi-hook is the image's, not
// the host's.
func hookAsThePluginSeesIt(opts Options) string {
	if opts.HostDriverRoot == "" || opts.DriverRoot == "" {
		return opts.CDIHookPath
	}
	rel, err := filepath.Rel(opts.HostDriverRoot, opts.CDIHookPath)
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return opts.CDIHookPath
	}
	if seen := filepath.Join(opts.DriverRoot, rel); pathExists(seen) {
		return seen
	}
	return opts.CDIHookPath
}

func pathExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// hookLoadsNVML says why the hook binary at path cannot set a memory
// limit, "" when it can: the hook dlopens the driver's libnvidia-ml, which
// a statically linked binary cannot (it crashes in nvmlInit; the image's
// hook is static, to run whatever the host's libc, see
// hack/build-cdi-hook.sh), and a container whose hook fails is not
// created. The plugin sees the hook at the path the host runs it from
// (InstallHook).
func hookLoadsNVML(path string) string {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Sprintf("cannot read the hook binary %s to tell whether it can load NVML: %v", path, err)
	}
	defer func() { _ = f.Close() }()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return ""
		}
	}
	return fmt.Sprintf("the hook binary %s is statically linked: its %s cannot load the driver's NVML, and no NVML hook is installed "+
		"(the release image ships one at %s; or install a dynamically linked %s, e.g. the NVIDIA Container Toolkit's, and point cdiHookPath at it)",
		path, memoryLimitHookName, DefaultNVMLHookSource, HookBinary)
}

// memoryLimitMiB is the limit the hook's environment gives: whole MiB,
// rounded down, so that a container never gets more than the bytes it was
// sold (shares and replicas are counted in bytes).
func memoryLimitMiB(bytes int64) int64 { return bytes / mebibyte }

// checkMemoryLimits refuses a claim whose limited devices differ in size:
// the hook reads one pair of variables per container and applies it to
// each GPU it is given, and the runtime keeps the last value of a name
// (see withVisibleDevicesVoid), so a container given both would get the
// larger device's limit on the smaller one, or the other way round.
// Where no limit is written, there is nothing to refuse.
func checkMemoryLimits(df *driverFiles, devices []Device) error {
	if !df.memLimits.Enforced {
		return nil
	}
	var first *Device
	for i := range devices {
		d := &devices[i]
		if d.MemoryLimitBytes == 0 {
			continue
		}
		if first != nil && memoryLimitMiB(d.MemoryLimitBytes) != memoryLimitMiB(first.MemoryLimitBytes) {
			return fmt.Errorf("devices %q (%d MiB) and %q (%d MiB) have different memory limits, but a container holds one limit for all its GPUs (%s): "+
				"ask for devices of one size per claim", first.Name, memoryLimitMiB(first.MemoryLimitBytes), d.Name, memoryLimitMiB(d.MemoryLimitBytes), memoryLimitEnv)
		}
		if first == nil {
			first = d
		}
	}
	return nil
}

// validateMemoryLimit catches limits the driver would refuse or the hook
// would misread.
func validateMemoryLimit(d Device) error {
	switch {
	case d.MemoryLimitBytes == 0:
		return nil
	case len(d.ExtraNodes) > 0 || strings.HasPrefix(d.UUID, "MIG-"):
		return fmt.Errorf("device %q: a memory limit on a MIG device (the driver refuses it; MIG isolates memory itself)", d.Name)
	case memoryLimitMiB(d.MemoryLimitBytes) < 1:
		return fmt.Errorf("device %q: memory limit %d bytes is below the hook's 1 MiB", d.Name, d.MemoryLimitBytes)
	}
	for _, k := range []string{memoryLimitEnv, memoryRequestEnv} {
		if _, ok := d.Env[k]; ok {
			return fmt.Errorf("device %q: %s is the handler's to set", d.Name, k)
		}
	}
	return nil
}

// withMemoryLimit adds to a device's edits the hook that sets its limit
// on its GPU, and the environment the hook reads it from: the request
// (the soft limit) as the limit, so that a request in the container's
// own environment cannot make the hook refuse the container.
func withMemoryLimit(df *driverFiles, edits *specs.ContainerEdits, env map[string]string, d Device) {
	if d.MemoryLimitBytes == 0 || !df.memLimits.Enforced {
		return
	}
	mib := strconv.FormatInt(memoryLimitMiB(d.MemoryLimitBytes), 10)
	env[memoryLimitEnv], env[memoryRequestEnv] = mib, mib
	hook := *df.memHook
	hook.Args = append(slices.Clip(hook.Args), "--gpu-id", d.UUID)
	edits.Hooks = append(edits.Hooks, &hook)
}

// memoryLimitHook is NVIDIA's hook as the toolkit's own specs run it (its
// hook creator), but for the GPU's UUID: a createRuntime hook, run on the
// host, that loads the host's NVML from the driver root.
// Where the configured hook is static, the installed NVML hook runs it
// through the image's loader (NVMLHook).
func memoryLimitHook(opts Options) *specs.Hook {
	hookArgs := []string{memoryLimitHookName, "--driver-root", hostDriverRootOf(opts)}
	hook := &specs.Hook{HookName: cdiapi.CreateRuntimeHook, Env: []string{"NVIDIA_CTK_DEBUG=false"}}
	if hookLoadsNVML(hookAsThePluginSeesIt(opts)) != "" {
		hook.Path, hook.Args = opts.NVMLHook.command(hookArgs...)
		return hook
	}
	args := []string{filepath.Base(opts.CDIHookPath)}
	if args[0] == "nvidia-ctk" {
		args = append(args, "hook")
	}
	hook.Path, hook.Args = opts.CDIHookPath, append(args, hookArgs...)
	return hook
}

// nvmlHookUsable says whether an installed NVML hook can set limits: its
// binary loads NVML and its loader is there (the plugin sees both at the
// host's paths).
func nvmlHookUsable(h NVMLHook) bool {
	return h.Binary != "" && hookLoadsNVML(h.Binary) == "" && pathExists(h.Loader)
}

// hostDriverRootOf is the driver root as the runtime's hooks see it.
func hostDriverRootOf(opts Options) string {
	if opts.HostDriverRoot != "" {
		return opts.HostDriverRoot
	}
	return opts.DriverRoot
}
