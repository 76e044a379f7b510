package plugin

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"time"

	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/cdi"
	"github.com/gpuaas/gpu-dra-driver/pkg/mig"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/checkpoint"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
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

// plannedDevice is one allocation result resolved to our device and its
// configuration.
type plannedDevice struct {
	result resourceapi.DeviceRequestAllocationResult
	device *AllocatableDevice
	config configapi.Interface
	// sharing are the GPU settings the device needs; nil for none.
	sharing *sharingPlan
}

func (p plannedDevice) adminAccess() bool {
	return p.result.AdminAccess != nil && *p.result.AdminAccess
}

// exclusive reports whether the device may be held by this claim alone.
func (p plannedDevice) exclusive() bool {
	return !p.adminAccess() && !p.device.multiAllocatable()
}

// Prepare makes a claim's devices on this node ready for containers and
// returns them with their CDI device IDs. Preparing a prepared claim returns
// the recorded result.
func (s *State) Prepare(ctx context.Context, claim *resourceapi.ResourceClaim) (devs []kubeletplugin.Device, err error) {
	start := time.Now()
	defer func() { s.metrics.observe("prepare", time.Since(start).Seconds(), err) }()
	logger := klog.FromContext(ctx).WithValues("claim", klog.KObj(claim), "claimUID", claim.UID)
	ctx = klog.NewContext(ctx, logger)

	if devs, ok, err := s.preparedBefore(ctx, claim.UID); ok || err != nil {
		return devs, err
	}
	plan, err := s.plan(claim)
	if err != nil {
		return nil, err
	}
	gpus := planGPUs(plan)
	defer s.inflight.add(claim.UID, gpus)()
	held, err := s.lockFresh(ctx, gpus)
	if err != nil {
		return nil, err
	}
	defer held.unlock()
	return s.prepareLocked(ctx, claim, plan, held)
}

// preparedBefore returns the recorded devices of a claim prepared earlier,
// read again under the locks of the GPUs its record names. It runs before
// planning, so that a prepared claim whose device is no longer published
// (GPU gone, mode changed) still gets its result on a retry.
func (s *State) preparedBefore(ctx context.Context, uid types.UID) ([]kubeletplugin.Device, bool, error) {
	rec, err := s.completedRecord(uid)
	if err != nil || rec == nil {
		return nil, false, err
	}
	held, err := s.locks.lock(recordGPUs(rec))
	if err != nil {
		return nil, false, err
	}
	defer held.unlock()
	// Unprepared meanwhile: prepare it anew.
	if rec, err = s.completedRecord(uid); err != nil || rec == nil {
		return nil, false, err
	}
	klog.FromContext(ctx).V(4).Info("Claim already prepared")
	return kubeletDevices(rec), true, nil
}

// completedRecord is the claim's record if its prepare completed; an error
// if what it was prepared with was lost in a reboot.
func (s *State) completedRecord(uid types.UID) (*checkpoint.Claim, error) {
	rec, err := s.store.Load(string(uid))
	if err != nil || rec == nil {
		return nil, err
	}
	if err := lostErr(rec); err != nil {
		return nil, err
	}
	if rec.State != checkpoint.PrepareCompleted {
		return nil, nil
	}
	return rec, nil
}

// prepareLocked prepares a claim whose GPUs are held.
func (s *State) prepareLocked(ctx context.Context, claim *resourceapi.ResourceClaim, plan []plannedDevice, held *heldGPUs) ([]kubeletplugin.Device, error) {
	logger := klog.FromContext(ctx)
	rec, err := s.store.Load(string(claim.UID))
	if err != nil {
		return nil, err
	}
	if err := lostErr(rec); err != nil {
		return nil, err
	}
	if rec != nil && rec.State == checkpoint.PrepareCompleted {
		logger.V(4).Info("Claim already prepared")
		return kubeletDevices(rec), nil
	}
	if err := held.stamp(); err != nil {
		return nil, err
	}
	if rec != nil {
		// Left by an attempt that was interrupted or failed to roll back:
		// undone first, so that this attempt starts from a clean GPU and its
		// record does not overwrite what the old one names.
		logger.Info("Undoing an earlier, unfinished prepare")
		if err := s.undo(context.WithoutCancel(ctx), rec); err != nil {
			return nil, fmt.Errorf("undoing an earlier, unfinished prepare: %w", err)
		}
	}
	if err := s.index.reserve(claim.UID, plan); err != nil {
		return nil, err
	}
	rec, err = s.prepareDevices(ctx, claim, plan)
	if err != nil {
		s.index.release(claim.UID, plan)
		return nil, err
	}
	s.index.add(rec)
	s.metrics.setPreparedClaims(s.index.list())
	logger.V(2).Info("Prepared claim", "devices", deviceNames(rec))
	return kubeletDevices(rec), nil
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
		if err := s.adoptSharing(rec, func(gpu string) bool { return on[gpu] }); err != nil {
			logger.Error(err, "Re-reading sharing settings", "claimUID", rec.UID)
		}
	}
	held.markSeen()
	s.metrics.setPreparedClaims(s.index.list())
	return nil
}

// plan resolves the claim's allocation results for our driver to devices
// published by this node, with their configuration.
func (s *State) plan(claim *resourceapi.ResourceClaim) ([]plannedDevice, error) {
	if claim.Status.Allocation == nil {
		return nil, fmt.Errorf("claim %s is not allocated", klog.KObj(claim))
	}
	configs, err := decodeConfigs(claim.Status.Allocation.Devices.Config)
	if err != nil {
		return nil, err
	}
	var plan []plannedDevice
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != configapi.DriverName {
			continue
		}
		p, err := s.planResult(r, configs)
		if err != nil {
			return nil, err
		}
		plan = append(plan, p)
	}
	if len(plan) == 0 {
		return nil, fmt.Errorf("claim %s has no devices of driver %s", klog.KObj(claim), configapi.DriverName)
	}
	if err := mpsOnOneGPUPerRequest(plan); err != nil {
		return nil, fmt.Errorf("claim %s: %w", klog.KObj(claim), err)
	}
	return plan, nil
}

func (s *State) planResult(r resourceapi.DeviceRequestAllocationResult, configs []opaqueConfig) (plannedDevice, error) {
	if r.Pool != s.nodeName {
		return plannedDevice{}, fmt.Errorf("device %s/%s is allocated from pool %q, not this node's (%q)", r.Pool, r.Device, r.Pool, s.nodeName)
	}
	dev, ok := s.deviceMap()[r.Device]
	if !ok {
		return plannedDevice{}, fmt.Errorf("device %q is not published by this node", r.Device)
	}
	cfg, err := configFor(configs, r.Request, dev.Type)
	if err != nil {
		return plannedDevice{}, err
	}
	p := plannedDevice{result: r, device: dev, config: cfg}
	if p.sharing, err = s.planSharing(p); err != nil {
		return plannedDevice{}, fmt.Errorf("device %s (request %q): %w", dev.Name(), r.Request, err)
	}
	return p, nil
}

// prepareDevices sets the devices up (MIG instances, sharing settings),
// writes the claim's
// CDI spec, then its checkpoint record. When set-up changes the GPU, the
// record is written first (PrepareStarted), so a crash half-way is undone at
// restart; otherwise a crash leaves at most a CDI spec without a record,
// which Restore deletes. A failure rolls back everything done so far.
func (s *State) prepareDevices(ctx context.Context, claim *resourceapi.ResourceClaim, plan []plannedDevice) (*checkpoint.Claim, error) {
	rec := newRecord(claim, plan)
	rec.BootID = s.bootID
	if needsSetUp(plan) || needsSharing(plan) {
		// Staged: a process crash keeps it, a power loss also resets what
		// set-up changes (checkpoint.Store.Stage). Only the completed
		// record, which the kubelet is then told of, is saved durably.
		if err := s.store.Stage(rec); err != nil {
			return nil, err
		}
	}
	err := s.setUpAll(ctx, plan, rec)
	if err == nil {
		err = s.acquireSharing(ctx, plan, rec)
	}
	if err == nil {
		err = s.writeSpec(plan, rec)
	}
	if err == nil {
		rec.State = checkpoint.PrepareCompleted
		if err = s.store.Save(rec); err != nil {
			_ = s.cdi.DeleteClaimSpec(rec.UID)
		}
	}
	if err != nil {
		// The kubelet cancels the call when it gives up on it; the rollback
		// must finish all the same.
		if rbErr := s.tearDown(context.WithoutCancel(ctx), rec); rbErr != nil {
			return nil, errors.Join(err, fmt.Errorf("rolling back: %w", rbErr))
		}
		_ = s.store.Delete(rec.UID)
		return nil, err
	}
	return rec, nil
}

func newRecord(claim *resourceapi.ResourceClaim, plan []plannedDevice) *checkpoint.Claim {
	rec := &checkpoint.Claim{UID: string(claim.UID), Namespace: claim.Namespace, Name: claim.Name, State: checkpoint.PrepareStarted}
	for _, p := range plan {
		rec.Devices = append(rec.Devices, checkpoint.Device{
			Requests:    []string{p.result.Request},
			Pool:        p.result.Pool,
			Device:      p.result.Device,
			GPUUUID:     p.device.GPU.UUID,
			AdminAccess: p.adminAccess(),
			GPUMode:     p.device.modeName(),
			Shared:      p.device.multiAllocatable(),
			ShareID:     string(ptr.Deref(p.result.ShareID, "")),
			Sharing:     p.sharing.settingsOrNil(),
			MPSLimits:   p.sharing.limitsOrNil(),
		})
	}
	return rec
}

// writeSpec writes the claim's CDI spec and records the CDI device IDs.
func (s *State) writeSpec(plan []plannedDevice, rec *checkpoint.Claim) error {
	devs, err := s.cdiDevices(plan, rec)
	if err != nil {
		return err
	}
	ids, err := s.cdi.WriteClaimSpec(rec.UID, devs)
	if err != nil {
		return fmt.Errorf("writing CDI spec: %w", err)
	}
	for i, p := range plan {
		rec.Devices[i].CDIDeviceIDs = []string{ids[p.device.Name()]}
	}
	return nil
}

// cdiDevices lists each device once, even when several requests of the claim
// got the same device (admin access). A MIG device is named by its own UUID
// and brings its capability nodes.
func (s *State) cdiDevices(plan []plannedDevice, rec *checkpoint.Claim) ([]cdi.Device, error) {
	seen := map[string]bool{}
	var out []cdi.Device
	for i, p := range plan {
		if seen[p.device.Name()] {
			continue
		}
		seen[p.device.Name()] = true
		d := cdi.Device{Name: p.device.Name(), UUID: p.device.GPU.UUID, Minor: p.device.GPU.Minor}
		if inst := migInstance(p, rec.Devices[i]); inst != nil {
			nodes, err := s.capNodes(p.device.GPU.Minor, inst)
			if err != nil {
				return nil, err
			}
			d.UUID, d.ExtraNodes = inst.UUID, nodes
		}
		d.Env, d.Mounts = s.sharingEdits(p)
		out = append(out, d)
	}
	return out, nil
}

// Unprepare undoes Prepare. Unpreparing an unknown claim is not an error:
// the kubelet retries, and the claim may have been cleaned up at start-up.
func (s *State) Unprepare(ctx context.Context, uid types.UID) (err error) {
	start := time.Now()
	defer func() { s.metrics.observe("unprepare", time.Since(start).Seconds(), err) }()
	gpus, err := s.claimGPUs(uid)
	if err != nil || gpus == nil {
		return err
	}
	held, err := s.lockFresh(ctx, gpus)
	if err != nil {
		return err
	}
	defer held.unlock()
	rec, err := s.store.Load(string(uid))
	if err != nil || rec == nil {
		return err // never prepared, rolled back, or unprepared already
	}
	if !slices.Equal(held.uuids, sortedGPUs(recordGPUs(rec))) {
		return fmt.Errorf("claim %s: record names GPUs %v, not the %v its prepare held", uid, recordGPUs(rec), held.uuids)
	}
	if err := held.stamp(); err != nil {
		return err
	}
	// What is torn down must be finished even if the kubelet gives up.
	if err := s.undo(context.WithoutCancel(ctx), rec); err != nil {
		return err
	}
	klog.FromContext(ctx).V(2).Info("Unprepared claim", "claim", klog.KRef(rec.Namespace, rec.Name), "claimUID", uid)
	return nil
}

// claimGPUs are the GPUs whose locks cover a claim: those its record names
// or, while its prepare is in flight in this process and has written no
// record yet, those the prepare holds, so that Unprepare waits for the
// prepare and then undoes it. Nil: the claim is not prepared.
func (s *State) claimGPUs(uid types.UID) ([]string, error) {
	rec, err := s.store.Load(string(uid))
	if err != nil {
		return nil, fmt.Errorf("reading record of claim %s: %w", uid, err)
	}
	if rec != nil {
		return recordGPUs(rec), nil
	}
	return s.inflight.gpus(uid), nil
}

// undo removes what prepare made, then forgets the claim. The record goes
// last, so a failure half-way is retried from the record.
func (s *State) undo(ctx context.Context, rec *checkpoint.Claim) error {
	if err := s.tearDown(ctx, rec); err != nil {
		return err
	}
	if err := s.cdi.DeleteClaimSpec(rec.UID); err != nil {
		return fmt.Errorf("deleting CDI spec: %w", err)
	}
	if err := s.store.Delete(rec.UID); err != nil {
		return err
	}
	s.index.remove(rec)
	s.metrics.setPreparedClaims(s.index.list())
	return nil
}
