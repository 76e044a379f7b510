// Package cdi writes one CDI spec per prepared ResourceClaim.
//
// Each claim gets its own spec file under the CDI root, named after the claim
// UID, so that preparing or unpreparing a claim touches exactly one file and
// never grows with the number of claims already prepared. The edits every GPU
// container needs (driver libraries and binaries, control device nodes) are
// computed in NewHandler and reused for every claim, until Refresh computes
// them again for another driver version (after a driver upgrade).
package cdi

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/nvidia-container-toolkit/pkg/nvcdi/transform/root"
	"github.com/gpuaas/gpu-dra-driver/pkg/mig"
	"k8s.io/klog/v2"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"
	specs "tags.cncf.io/container-device-interface/specs-go"
)

const (
	// Vendor is the CDI vendor of our specs; it differs from NVIDIA's
	// "nvidia.com" so that our per-claim specs never clash with a spec the
	// NVIDIA Container Toolkit generates on the same host.
	Vendor = "k8s.gpu.gpuaas.io"
	// Class is the CDI class of our specs: one device per claimed device.
	Class = "claim"
	// Kind is the CDI kind of our specs.
	Kind = Vendor + "/" + Class

	visibleDevicesEnv = "NVIDIA_VISIBLE_DEVICES"
	specFileMode      = 0o644
)

// Options configures a Handler.
type Options struct {
	// CDIRoot is the directory the container runtime reads CDI specs from,
	// e.g. /var/run/cdi. It is created if missing.
	CDIRoot string
	// DriverRoot is where the NVIDIA driver is installed on the host ("/"
	// normally). Empty, or a root without the driver, means no driver files
	// are injected: device nodes and env only.
	DriverRoot string
	// DevRoot is where /dev/nvidia* live; defaults to DriverRoot.
	DevRoot string
	// HostDriverRoot is DriverRoot as the container runtime on the host
	// sees it, when the plugin sees the driver elsewhere: the chart mounts
	// a host install ("/") at /host in the plugin's container. Every host
	// path a spec names (libraries, binaries, device nodes) is moved from
	// DriverRoot (and DevRoot) to it. Empty means the same as DriverRoot.
	HostDriverRoot string
	// ProcDevicesPath is the kernel's list of device majors, where the
	// major of the MIG capability nodes is read; empty means
	// /proc/devices. Tests point it at a fake.
	ProcDevicesPath string
	// NVML is the (possibly mock) NVML the plugin uses; nvcdi reads the
	// driver version from it.
	NVML nvml.Interface
	// CDIHookPath is the host path of the nvidia-cdi-hook binary
	// (InstallHook puts the image's there). With a driver installed it
	// must be set: without the hook's ldcache update and links no
	// container finds libcuda.so.1, so NewHandler refuses to start rather
	// than hand out GPUs CUDA cannot use. HooksDisabled leaves the hooks
	// out on purpose.
	CDIHookPath string
	// NVMLHook is an installed dynamic hook (InstallNVMLHook), which sets
	// devices' memory limits where CDIHookPath's binary is static and so
	// cannot load NVML; zero means none.
	NVMLHook NVMLHook
	// CgroupV2 reports whether the host's cgroups are v2, or why not; nil
	// means a statfs of DefaultCgroupRoot. The memory-limit hook runs only
	// on cgroup v2 (MemoryLimits). Tests set it.
	CgroupV2 func() (bool, string)
	// Logger is used for the few messages NewHandler logs; the zero value
	// means klog.Background().
	Logger klog.Logger
}

// Device is one allocated device of a claim.
type Device struct {
	// Name is our DRA device name, e.g. "gpu-3"; it becomes part of the CDI
	// device name.
	Name string
	// UUID is the GPU (or MIG) UUID, listed in NVIDIA_VISIBLE_DEVICES.
	UUID string
	// Minor is the minor number of /dev/nvidia<Minor>.
	Minor int
	// ExtraNodes are the capability nodes of a MIG device. They are
	// written as full character devices (the handler adds the nvidia-caps
	// major), so the runtime creates them in the container whether or not
	// the host has them.
	ExtraNodes []mig.CapNode
	// Env is extra environment for this device, e.g. MPS settings.
	Env map[string]string
	// Mounts are host directories bind-mounted into the container, e.g.
	// the MPS daemon's pipe directory and the shared memory its clients
	// talk through.
	Mounts []Mount
	// MemoryLimitBytes is the device memory the driver lets a container
	// given this device use on its GPU, 0 for no limit: a time-slice
	// replica's or a memory share's size. Written only where the driver
	// enforces it (Handler.MemoryLimits), as NVIDIA's memory-limit hook.
	MemoryLimitBytes int64
}

// Mount is a host directory and where a container sees it.
type Mount struct {
	HostPath      string
	ContainerPath string
}

// Handler writes and deletes per-claim CDI specs. It is safe for concurrent
// use: the cached common edits are never modified, only replaced whole by
// Refresh.
type Handler struct {
	cdiRoot string
	driver  atomic.Pointer[driverFiles]
	// refreshMu orders Refreshes; opts is theirs.
	refreshMu sync.Mutex
	opts      Options
	log       klog.Logger
}

// driverFiles is what a spec takes from the installed driver, computed
// for one driver version.
type driverFiles struct {
	// version is the driver whose files common names; "" when none are
	// (no driver installed under the driver root).
	version string
	nodes   nodeChecker
	common  specs.ContainerEdits
	// memLimits: whether devices' memory limits are written, with the
	// hook that sets them (all but its --gpu-id) when they are.
	memLimits MemoryLimits
	memHook   *specs.Hook
}

// NewHandler computes the edits common to all claims and prepares the CDI
// root.
func NewHandler(opts Options) (*Handler, error) {
	if opts.CDIRoot == "" {
		return nil, fmt.Errorf("CDI root must be set")
	}
	log := opts.Logger
	if log.GetSink() == nil {
		log = klog.Background()
	}
	log = klog.LoggerWithName(log, "cdi")
	if err := os.MkdirAll(opts.CDIRoot, 0o755); err != nil {
		return nil, fmt.Errorf("create CDI root %q: %w", opts.CDIRoot, err)
	}
	removeStaleTempFiles(log, opts.CDIRoot)
	df, err := discoverDriverFiles(log, opts)
	if err != nil {
		return nil, err
	}
	h := &Handler{cdiRoot: opts.CDIRoot, opts: opts, log: log}
	h.driver.Store(df)
	return h, nil
}

// Refresh discovers the driver's files again through lib (a new NVML
// session, after a driver upgrade): specs written from then on name the
// driver NVML reports now; those already written are left alone (their
// containers run on the driver they started with until restarted). It
// returns the driver version the specs now name ("" for none). On an
// error the previous edits are kept.
func (h *Handler) Refresh(lib nvml.Interface) (string, error) {
	h.refreshMu.Lock()
	defer h.refreshMu.Unlock()
	opts := h.opts
	opts.NVML = lib
	df, err := discoverDriverFiles(h.log, opts)
	if err != nil {
		return h.DriverVersion(), err
	}
	h.opts = opts
	h.driver.Store(df)
	return df.version, nil
}

// DriverVersion is the driver whose files the specs name, "" for none.
func (h *Handler) DriverVersion() string { return h.driver.Load().version }

// discoverDriverFiles computes the common edits of the driver installed
// now (nvcdi's discovery), moved to the host's driver root.
func discoverDriverFiles(log klog.Logger, opts Options) (*driverFiles, error) {
	version, why := installedDriver(log, opts)
	common, err := commonEdits(log, opts, version, why)
	if err != nil {
		return nil, err
	}
	if common, err = toHostRoot(opts, common); err != nil {
		return nil, err
	}
	df := &driverFiles{version: version, nodes: newNodeChecker(opts, why == ""), common: common,
		memLimits: memoryLimitsOf(opts, version, why)}
	if df.memLimits.Enforced {
		df.memHook = memoryLimitHook(opts)
	} else {
		// The plugin says so at start, with the devices it concerns.
		log.V(1).Info("No memory limits in the CDI specs", "cause", df.memLimits.Cause, "reason", df.memLimits.Reason)
	}
	return df, nil
}

// SpecPath is the file holding the CDI spec of one claim.
func SpecPath(cdiRoot, claimUID string) string {
	return filepath.Join(cdiRoot, specFileName(claimUID))
}

// DeviceID is the fully-qualified CDI device ID of one device of a claim.
func DeviceID(claimUID, deviceName string) string {
	return parser.QualifiedName(Vendor, Class, cdiDeviceName(claimUID, deviceName))
}

// specFilePrefix/specFileSuffix frame the claim UID in our file names; the
// same scheme as cdi.GenerateTransientSpecName.
var (
	specFilePrefix = cdiapi.GenerateTransientSpecName(Vendor, Class, "")
	specFileSuffix = ".json"
)

func specFileName(claimUID string) string {
	return specFilePrefix + claimUID + specFileSuffix
}

// cdiDeviceName prefixes our device name with the claim UID: CDI device names
// are global per kind, and one GPU may be in several claims (sharing).
func cdiDeviceName(claimUID, deviceName string) string {
	return claimUID + "-" + deviceName
}

// WriteClaimSpec writes the spec of one claim atomically and returns, per
// device name, its fully-qualified CDI device ID. Rewriting a claim replaces
// its spec.
func (h *Handler) WriteClaimSpec(claimUID string, devices []Device) (map[string]string, error) {
	spec, err := h.buildSpec(claimUID, devices)
	if err != nil {
		return nil, fmt.Errorf("CDI spec for claim %s: %w", claimUID, err)
	}
	if err := writeSpec(SpecPath(h.cdiRoot, claimUID), spec); err != nil {
		return nil, fmt.Errorf("CDI spec for claim %s: %w", claimUID, err)
	}
	ids := make(map[string]string, len(devices))
	for _, d := range devices {
		ids[d.Name] = DeviceID(claimUID, d.Name)
	}
	return ids, nil
}

// DeleteClaimSpec removes the spec of one claim; a missing spec is not an
// error so that unprepare can be retried.
func (h *Handler) DeleteClaimSpec(claimUID string) error {
	if err := validateClaimUID(claimUID); err != nil {
		return err
	}
	err := os.Remove(SpecPath(h.cdiRoot, claimUID))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("delete CDI spec of claim %s: %w", claimUID, err)
	}
	return nil
}

// ClaimSpecUIDs lists the claims that have a spec of ours under the CDI root,
// sorted, so that specs of claims deleted while the plugin was down can be
// found. Files of other vendors and our temporary files are ignored.
func (h *Handler) ClaimSpecUIDs() ([]string, error) {
	entries, err := os.ReadDir(h.cdiRoot)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list CDI root %q: %w", h.cdiRoot, err)
	}
	var uids []string
	for _, e := range entries {
		if uid, ok := claimUIDOf(e); ok {
			uids = append(uids, uid)
		}
	}
	sort.Strings(uids)
	return uids, nil
}

func claimUIDOf(e os.DirEntry) (string, bool) {
	if !e.Type().IsRegular() {
		return "", false
	}
	uid, ok := strings.CutPrefix(e.Name(), specFilePrefix)
	if !ok {
		return "", false
	}
	uid, ok = strings.CutSuffix(uid, specFileSuffix)
	if !ok || validateClaimUID(uid) != nil {
		return "", false
	}
	return uid, true
}

// validateClaimUID rejects UIDs that would not make a plain file name or a
// valid CDI device name (Kubernetes UIDs always pass).
func validateClaimUID(claimUID string) error {
	if err := parser.ValidateDeviceName(claimUID); err != nil {
		return fmt.Errorf("invalid claim UID %q: %w", claimUID, err)
	}
	return nil
}

// hostDevRootOf is where the runtime finds the device nodes on the host.
func hostDevRootOf(opts Options) string {
	if opts.HostDriverRoot != "" {
		return opts.HostDriverRoot
	}
	return devRootOf(opts)
}

// toHostRoot moves the host paths of the common edits from the driver root
// the plugin sees to the one on the host (nvcdi's driver-root transform):
// the runtime reads the spec on the host, where /host/usr/lib/... does not
// exist and every GPU container failed.
func toHostRoot(opts Options, edits specs.ContainerEdits) (specs.ContainerEdits, error) {
	if opts.HostDriverRoot == "" || opts.DriverRoot == "" {
		return edits, nil
	}
	spec := &specs.Spec{ContainerEdits: edits}
	t := root.NewDriverTransformer(
		root.WithDriverRoot(opts.DriverRoot), root.WithTargetDriverRoot(opts.HostDriverRoot),
		root.WithDevRoot(devRootOf(opts)), root.WithTargetDevRoot(opts.HostDriverRoot),
	)
	if err := t.Transform(spec); err != nil {
		return edits, fmt.Errorf("moving driver paths from %s to the host's %s: %w", opts.DriverRoot, opts.HostDriverRoot, err)
	}
	return spec.ContainerEdits, nil
}

func devRootOf(opts Options) string {
	if opts.DevRoot != "" {
		return opts.DevRoot
	}
	return opts.DriverRoot
}
