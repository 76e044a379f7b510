package plugin

import (
	"cmp"
	"context"
	"fmt"
	"path/filepath"
	"sync"

	"github.com/gpuaas/gpu-dra-driver/pkg/cdi"
	"github.com/gpuaas/gpu-dra-driver/pkg/mig"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/checkpoint"
	"k8s.io/klog/v2"
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
	Devices  []AllocatableDevice
	NVML     nvdev.Interface
	CDI      CDIWriter
	Store    *checkpoint.Store
	Metrics  *Metrics
	// MigMinorsPath is where the driver lists MIG capability minors;
	// empty means mig.MigMinorsPath.
	MigMinorsPath string
	// Sharing applies time-slice and MPS settings; nil means a Sharing
	// with no driver tools, where only Default-interval time-slicing works.
	Sharing *Sharing
	// LockDir holds the per-GPU lock files, shared with the other plugin
	// instance of a rolling update; empty means "locks" beside the
	// checkpoint directory.
	LockDir string
	// BootIDPath is where the ID of the node's current boot is read;
	// empty means DefaultBootIDPath.
	BootIDPath string
	// Faults is told of devices whose teardown failed; nil records nothing.
	Faults FaultRecorder
	// Events records warnings on the Node; zero records none.
	Events nodeEvents
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

// noSteps records nothing.
type noSteps struct{}

func (noSteps) Step(context.Context, string) {}

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
	// under devMu, so a reader holds a consistent map (deviceMap).
	devMu    sync.RWMutex
	devices  map[string]*AllocatableDevice
	nvml     nvdev.Interface
	migCaps  string
	cdi      CDIWriter
	store    *checkpoint.Store
	metrics  *Metrics
	locks    *gpuLocks
	index    *claimIndex
	inflight *inflight
	sharing  *Sharing
	faults   FaultRecorder
	events   nodeEvents
	steps    StepRecorder
	// onRebound is told of a GPU re-bound with a new minor number by a
	// MIG mode change (rebind.go): the driver republishes; nil tells none.
	onRebound func(ctx context.Context, uuid string, minor int)
	// inUseRetry is how a MIG mode change waits for a GPU another process
	// holds; a zero First means mig.DefaultInUseRetry.
	inUseRetry mig.InUseRetry
	// unowned are the GPU instances on dynamic-MIG GPUs that no claim
	// owned at Restore, by GPU UUID; withhold reads them before serving.
	unowned map[string][]mig.GPUInstance
	// bootID is the node's current boot, recorded with each claim so that
	// Restore knows what a reboot took; empty if it could not be read
	// (bootIDErr), and then reboots go unnoticed.
	bootID    string
	bootIDErr error
}

// deviceMap returns the published devices by name; the map must not be
// changed.
func (s *State) deviceMap() map[string]*AllocatableDevice {
	s.devMu.RLock()
	defer s.devMu.RUnlock()
	return s.devices
}

// replaceGPUDevices makes devs the devices of GPU uuid, in place of those
// it had (a static MIG layout changed). Claims already prepared keep the
// devices they planned with; unprepare needs none.
func (s *State) replaceGPUDevices(uuid string, devs []AllocatableDevice) {
	s.devMu.Lock()
	defer s.devMu.Unlock()
	next := make(map[string]*AllocatableDevice, len(s.devices)+len(devs))
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

// NewState builds an empty state; Restore loads what a previous run left.
func NewState(cfg StateConfig) *State {
	devices := make(map[string]*AllocatableDevice, len(cfg.Devices))
	for i := range cfg.Devices {
		devices[cfg.Devices[i].Name()] = &cfg.Devices[i]
	}
	s := &State{
		nodeName: cfg.NodeName,
		devices:  devices,
		nvml:     cfg.NVML,
		migCaps:  cmp.Or(cfg.MigMinorsPath, mig.MigMinorsPath),
		cdi:      cfg.CDI,
		store:    cfg.Store,
		metrics:  cfg.Metrics,
		locks:    newGPULocks(cmp.Or(cfg.LockDir, filepath.Join(filepath.Dir(cfg.Store.Dir()), "locks"))),
		index:    newClaimIndex(),
		inflight: newInflight(),
		sharing:  cmp.Or(cfg.Sharing, NewSharing(SharingOptions{})),
		faults:   cfg.Faults,
		events:   cfg.Events,
	}
	if s.faults == nil {
		s.faults = noFaults{}
	}
	s.steps = cmp.Or[StepRecorder](cfg.Steps, noSteps{})
	s.bootID, s.bootIDErr = readBootID(cmp.Or(cfg.BootIDPath, DefaultBootIDPath))
	return s
}

// lockFresh locks the GPUs and brings this process's view of them up to
// date with the checkpoint, should the other plugin instance of a rolling
// update have changed their claims since this one last looked.
func (s *State) lockFresh(ctx context.Context, gpus []string) (*heldGPUs, error) {
	held, err := s.locks.lock(gpus)
	if err != nil {
		return nil, err
	}
	if err := s.refresh(ctx, held); err != nil {
		held.unlock()
		return nil, err
	}
	return held, nil
}

// refresh re-reads the claims of the held GPUs that another process
// changed. It reads the whole checkpoint, which only happens while two
// plugin instances take turns on a GPU; otherwise the cache is current.
func (s *State) refresh(ctx context.Context, held *heldGPUs) error {
	stale := held.stale()
	if len(stale) == 0 {
		return nil
	}
	logger := klog.FromContext(ctx)
	records, damaged, err := s.store.List()
	if err != nil {
		return fmt.Errorf("re-reading the checkpoint: %w", err)
	}
	for _, d := range damaged {
		logger.Error(d.Err, "Checkpoint record damaged; it is rebuilt at the next start", "claimUID", d.UID)
	}
	logger.V(4).Info("Re-reading claims another plugin instance changed", "gpus", stale, "records", len(records))
	s.index.reload(stale, records)
	on := toSet(stale)
	for _, gpu := range stale {
		s.sharing.forget(gpu)
	}
	for _, rec := range records {
		if err := s.adoptRecord(rec, func(gpu string) bool { return on[gpu] }); err != nil {
			logger.Error(err, "Re-reading sharing settings", "claimUID", rec.UID)
		}
	}
	held.markSeen()
	s.metrics.setPreparedClaims(s.index.list())
	return nil
}
