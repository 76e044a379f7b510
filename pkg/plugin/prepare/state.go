// Package prepare prepares and undoes claims: it plans a claim's devices,
// sets them up through their kinds (package device) under per-GPU locks,
// writes the CDI spec and the checkpoint record, undoes all of it on
// unprepare or failure, and restores what a previous run (or a reboot)
// left. It knows nothing of gRPC or of publishing.
package prepare

import (
	"cmp"
	"context"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/gpuaas/gpu-dra-driver/pkg/cdi"
	"github.com/gpuaas/gpu-dra-driver/pkg/mig"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/checkpoint"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/device"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/telemetry"
)

// CDIWriter is what State needs of pkg/cdi; an interface so that tests can
// inject failures.
type CDIWriter interface {
	WriteClaimSpec(claimUID string, devices []cdi.Device) (map[string]string, error)
	DeleteClaimSpec(claimUID string) error
	ClaimSpecUIDs() ([]string, error)
}

// StateConfig wires a State.
type StateConfig struct {
	NodeName string
	Devices  []device.AllocatableDevice
	NVML     nvdev.Interface
	CDI      CDIWriter
	Store    *checkpoint.Store
	Metrics  *telemetry.Metrics
	// MigMinorsPath is where the driver lists MIG capability minors;
	// empty means mig.MigMinorsPath.
	MigMinorsPath string
	// Sharing applies time-slice and MPS settings; nil means a Sharing
	// with no driver tools, where only Default-interval time-slicing works.
	Sharing *device.Sharing
	// LockDir holds the per-GPU lock files, shared with the other plugin
	// instance of a rolling update; empty means "locks" beside the
	// checkpoint directory.
	LockDir string
	// LockWait bounds the wait for a GPU's lock; zero means
	// DefaultLockWait.
	LockWait time.Duration
	// BootIDPath is where the ID of the node's current boot is read;
	// empty means DefaultBootIDPath.
	BootIDPath string
	// Faults is told of devices whose teardown failed; nil records nothing.
	Faults device.FaultRecorder
	// Events records warnings on the Node; zero records none.
	Events telemetry.NodeEvents
	// InUseRetry is how a MIG mode change waits for a GPU another process
	// holds; zero means mig.DefaultInUseRetry.
	InUseRetry mig.InUseRetry
	// Steps is told how far Restore is (the health probes' view of a long
	// start); nil tells nobody.
	Steps StepRecorder
}

// StepRecorder follows a start: each step restarts its hang timer, so a
// restore of many claims is timed claim by claim, not as a whole (see
// Health).
type StepRecorder interface {
	Step(ctx context.Context, step string)
}

// NoSteps records nothing.
type NoSteps struct{}

func (NoSteps) Step(context.Context, string) {}

// State owns the node's prepared claims. Prepare and Unprepare of claims on
// different GPUs run in parallel; the index below is only held for map
// updates, never across I/O.
//
// The checkpoint on disk is the truth: during a rolling update two plugin
// processes serve the same node, and the kubelet may prepare a claim in one
// and unprepare it in the other. Every call takes its GPUs' locks (which
// exclude the other process too) and reads the claim's record under them;
// the index and the sharing counts are caches, re-read for a GPU when the
// other process changed its claims (see gpuLocks).
type State struct {
	nodeName string
	// devices are the published devices by name. The map is never changed
	// once serving: a new layout (static MIG re-read) replaces it whole
	// under devMu, so a reader holds a consistent map (DeviceMap).
	devMu   sync.RWMutex
	devices map[string]*device.AllocatableDevice
	// env is what the device kinds set devices up on: NVML, the
	// checkpoint store, the sharing settings, the fault recorder, and how
	// a MIG mode change waits for a GPU in use.
	env      device.Env
	cdi      CDIWriter
	metrics  *telemetry.Metrics
	locks    *gpuLocks
	index    *claimIndex
	inflight *inflight
	events   telemetry.NodeEvents
	steps    StepRecorder
	// onRebound is told of a GPU re-bound with a new minor number by a
	// MIG mode change (rebind.go): the driver republishes; nil tells none.
	onRebound func(ctx context.Context, uuid string, minor int)
	// unowned are the GPU instances on dynamic-MIG GPUs that no claim
	// owned at Restore, by GPU UUID; Withhold reads them before serving.
	unowned map[string][]mig.GPUInstance
	// bootID is the node's current boot, recorded with each claim so that
	// Restore knows what a reboot took; empty if it could not be read
	// (bootIDErr), and then reboots go unnoticed.
	bootID    string
	bootIDErr error
	// claimGetLimit is the most prepared claims Restore checks with a GET
	// each (MaxClaimGets; tests lower it).
	claimGetLimit int
}

// DeviceMap returns the published devices by name; the map must not be
// changed.
func (s *State) DeviceMap() map[string]*device.AllocatableDevice {
	s.devMu.RLock()
	defer s.devMu.RUnlock()
	return s.devices
}

// ReplaceGPUDevices makes devs the devices of GPU uuid, in place of those
// it had (a static MIG layout changed). Claims already prepared keep the
// devices they planned with; unprepare needs none.
func (s *State) ReplaceGPUDevices(uuid string, devs []device.AllocatableDevice) {
	s.devMu.Lock()
	defer s.devMu.Unlock()
	next := make(map[string]*device.AllocatableDevice, len(s.devices)+len(devs))
	for name, d := range s.devices {
		if d.GPU.UUID != uuid {
			next[name] = d
		}
	}
	for i := range devs {
		next[devs[i].Name()] = &devs[i]
	}
	s.devices = next
}

// gpuIndexes names the GPUs of devices by their index, for errors; a GPU
// no device names (gone since its claims were prepared) by its UUID.
func gpuIndexes(devices []device.AllocatableDevice) func(uuid string) string {
	index := make(map[string]int, len(devices))
	for _, d := range devices {
		index[d.GPU.UUID] = d.GPU.Index
	}
	return func(uuid string) string {
		if i, ok := index[uuid]; ok {
			return strconv.Itoa(i)
		}
		return uuid
	}
}

// NewState builds an empty state; Restore loads what a previous run left.
func NewState(cfg StateConfig) *State {
	devices := make(map[string]*device.AllocatableDevice, len(cfg.Devices))
	for i := range cfg.Devices {
		devices[cfg.Devices[i].Name()] = &cfg.Devices[i]
	}
	s := &State{
		nodeName: cfg.NodeName,
		devices:  devices,
		env: device.Env{NVML: cfg.NVML, Store: cfg.Store, MigCaps: cmp.Or(cfg.MigMinorsPath, mig.MigMinorsPath),
			Sharing: cmp.Or(cfg.Sharing, device.NewSharing(device.SharingOptions{})), Faults: cfg.Faults,
			InUseRetry: cfg.InUseRetry},
		cdi:           cfg.CDI,
		metrics:       cfg.Metrics,
		locks:         newGPULocks(cmp.Or(cfg.LockDir, filepath.Join(filepath.Dir(cfg.Store.Dir()), "locks"))),
		index:         newClaimIndex(),
		inflight:      newInflight(),
		events:        cfg.Events,
		claimGetLimit: MaxClaimGets,
	}
	if s.env.Faults == nil {
		s.env.Faults = device.NoFaults{}
	}
	s.locks.wait = cmp.Or(cfg.LockWait, DefaultLockWait)
	s.locks.label = gpuIndexes(cfg.Devices)
	s.env.Rebound = s.GPURebound
	s.steps = cmp.Or[StepRecorder](cfg.Steps, NoSteps{})
	s.bootID, s.bootIDErr = readBootID(cmp.Or(cfg.BootIDPath, DefaultBootIDPath))
	return s
}
