package plugin

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/cdi"
	"github.com/gpuaas/gpu-dra-driver/pkg/mig"
	"github.com/gpuaas/gpu-dra-driver/pkg/mps"
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
}

// State owns the node's prepared claims. Prepare and Unprepare of claims on
// different GPUs run in parallel; the index below is only held for map
// updates, never across I/O.
type State struct {
	nodeName string
	devices  map[string]*AllocatableDevice
	nvml     nvdev.Interface
	migCaps  string
	cdi      CDIWriter
	store    *checkpoint.Store
	metrics  *Metrics
	locks    *gpuLocks
	index    *claimIndex
	sharing  *Sharing
}

// NewState builds an empty state; Restore loads what a previous run left.
func NewState(cfg StateConfig) *State {
	devices := make(map[string]*AllocatableDevice, len(cfg.Devices))
	for i := range cfg.Devices {
		devices[cfg.Devices[i].Name()] = &cfg.Devices[i]
	}
	return &State{
		nodeName: cfg.NodeName,
		devices:  devices,
		nvml:     cfg.NVML,
		migCaps:  cmp.Or(cfg.MigMinorsPath, mig.MigMinorsPath),
		cdi:      cfg.CDI,
		store:    cfg.Store,
		metrics:  cfg.Metrics,
		locks:    newGPULocks(),
		index:    newClaimIndex(),
		sharing:  cmp.Or(cfg.Sharing, NewSharing(SharingOptions{})),
	}
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

	plan, err := s.plan(claim)
	if err != nil {
		return nil, err
	}
	unlock := s.locks.lock(planGPUs(plan))
	defer unlock()
	if rec := s.index.get(claim.UID); rec != nil {
		logger.V(4).Info("Claim already prepared")
		return kubeletDevices(rec), nil
	}
	if err := s.index.reserve(claim.UID, plan); err != nil {
		return nil, err
	}
	rec, err := s.prepareDevices(ctx, claim, plan)
	if err != nil {
		s.index.release(claim.UID, plan)
		return nil, err
	}
	s.index.add(rec)
	s.metrics.setPrepared(s.index.counts())
	logger.V(2).Info("Prepared claim", "devices", deviceNames(rec))
	return kubeletDevices(rec), nil
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
	return plan, nil
}

func (s *State) planResult(r resourceapi.DeviceRequestAllocationResult, configs []opaqueConfig) (plannedDevice, error) {
	if r.Pool != s.nodeName {
		return plannedDevice{}, fmt.Errorf("device %s/%s is allocated from pool %q, not this node's (%q)", r.Pool, r.Device, r.Pool, s.nodeName)
	}
	dev, ok := s.devices[r.Device]
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
	if needsSetUp(plan) || needsSharing(plan) {
		if err := s.store.Save(rec); err != nil {
			return nil, err
		}
	}
	err := s.setUpAll(plan, rec)
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
		if rbErr := s.tearDown(ctx, rec); rbErr != nil {
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
		d.Env = s.sharingEnv(p)
		if dir, ok := d.Env[mps.EnvPipeDir]; ok {
			d.Mounts = []string{dir}
		}
		out = append(out, d)
	}
	return out, nil
}

// Unprepare undoes Prepare. Unpreparing an unknown claim is not an error:
// the kubelet retries, and the claim may have been cleaned up at start-up.
func (s *State) Unprepare(ctx context.Context, uid types.UID) (err error) {
	start := time.Now()
	defer func() { s.metrics.observe("unprepare", time.Since(start).Seconds(), err) }()
	rec := s.index.get(uid)
	if rec == nil {
		return nil
	}
	unlock := s.locks.lock(recordGPUs(rec))
	defer unlock()
	if rec = s.index.get(uid); rec == nil {
		return nil
	}
	if err := s.undo(ctx, rec); err != nil {
		return err
	}
	klog.FromContext(ctx).V(2).Info("Unprepared claim", "claim", klog.KRef(rec.Namespace, rec.Name), "claimUID", uid)
	return nil
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
	s.metrics.setPrepared(s.index.counts())
	return nil
}

func kubeletDevices(rec *checkpoint.Claim) []kubeletplugin.Device {
	out := make([]kubeletplugin.Device, 0, len(rec.Devices))
	for _, d := range rec.Devices {
		dev := kubeletplugin.Device{
			Requests:     d.Requests,
			PoolName:     d.Pool,
			DeviceName:   d.Device,
			CDIDeviceIDs: d.CDIDeviceIDs,
		}
		if d.ShareID != "" {
			dev.ShareID = ptr.To(types.UID(d.ShareID))
		}
		out = append(out, dev)
	}
	return out
}

func deviceNames(rec *checkpoint.Claim) []string {
	out := make([]string, 0, len(rec.Devices))
	for _, d := range rec.Devices {
		out = append(out, d.Device)
	}
	return out
}

func planGPUs(plan []plannedDevice) []string {
	out := make([]string, 0, len(plan))
	for _, p := range plan {
		out = append(out, p.device.GPU.UUID)
	}
	return out
}

func recordGPUs(rec *checkpoint.Claim) []string {
	out := make([]string, 0, len(rec.Devices))
	for _, d := range rec.Devices {
		out = append(out, d.GPUUUID)
	}
	return out
}
