package prepare

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/cdi"
	"github.com/gpuaas/gpu-dra-driver/pkg/deviceweight"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/checkpoint"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/device"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
)

// Prepare makes a claim's devices on this node ready for containers and
// returns them with their CDI device IDs. Preparing a prepared claim returns
// the recorded result.
func (s *State) Prepare(ctx context.Context, claim *resourceapi.ResourceClaim) ([]kubeletplugin.Device, error) {
	return s.prepare(ctx, claim, false)
}

// prepare is Prepare; rebuild says the claim was prepared before and its
// record could not be read (device.Planned.Rebuild).
func (s *State) prepare(ctx context.Context, claim *resourceapi.ResourceClaim, rebuild bool) (devs []kubeletplugin.Device, err error) {
	start := time.Now()
	defer func() { s.metrics.Observe("prepare", time.Since(start).Seconds(), err) }()
	logger := klog.FromContext(ctx).WithValues("claim", klog.KObj(claim), "claimUID", claim.UID)
	ctx = klog.NewContext(ctx, logger)

	if devs, ok, err := s.preparedBefore(ctx, claim.UID); ok || err != nil {
		return devs, err
	}
	plan, err := s.plan(claim)
	if err != nil {
		return nil, err
	}
	for i := range plan {
		plan[i].Rebuild = rebuild
	}
	gpus := planGPUs(plan)
	defer s.inflight.add(claim.UID, gpus)()
	held, err := s.lockFresh(ctx, lockHolder(claim.UID), gpus)
	if err != nil {
		return nil, err
	}
	defer held.unlock()
	return s.prepareLocked(ctx, claim, plan, held)
}

// lockHolder names a claim as the holder of its GPUs' locks.
func lockHolder(uid types.UID) string { return "claim " + string(uid) }

// preparedBefore returns the recorded devices of a claim prepared earlier,
// read again under the locks of the GPUs its record names. It runs before
// planning, so that a prepared claim whose device is no longer published
// (GPU gone, mode changed) still gets its result on a retry.
func (s *State) preparedBefore(ctx context.Context, uid types.UID) ([]kubeletplugin.Device, bool, error) {
	rec, err := s.completedRecord(uid)
	if err != nil || rec == nil {
		return nil, false, err
	}
	held, err := s.locks.lock(ctx, lockHolder(uid), recordGPUs(rec))
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
	rec, err := s.env.Store.Load(string(uid))
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
func (s *State) prepareLocked(ctx context.Context, claim *resourceapi.ResourceClaim, plan []device.Planned, held *heldGPUs) ([]kubeletplugin.Device, error) {
	logger := klog.FromContext(ctx)
	rec, err := s.env.Store.Load(string(claim.UID))
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
	s.metrics.SetPreparedClaims(s.index.list())
	logger.V(2).Info("Prepared claim", "devices", deviceNames(rec))
	return kubeletDevices(rec), nil
}

// plan resolves the claim's allocation results for our driver to devices
// published by this node, with their configuration.
func (s *State) plan(claim *resourceapi.ResourceClaim) ([]device.Planned, error) {
	if claim.Status.Allocation == nil {
		return nil, fmt.Errorf("claim %s is not allocated", klog.KObj(claim))
	}
	configs, err := decodeConfigs(claim.Status.Allocation.Devices.Config)
	if err != nil {
		return nil, err
	}
	var plan []device.Planned
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
	if err := device.MPSOnOneGPUPerRequest(plan); err != nil {
		return nil, fmt.Errorf("claim %s: %w", klog.KObj(claim), err)
	}
	return plan, nil
}

func (s *State) planResult(r resourceapi.DeviceRequestAllocationResult, configs []opaqueConfig) (device.Planned, error) {
	if r.Pool != s.nodeName {
		return device.Planned{}, fmt.Errorf("device %s/%s is allocated from pool %q, not this node's (%q)", r.Pool, r.Device, r.Pool, s.nodeName)
	}
	dev, ok := s.DeviceMap()[r.Device]
	if !ok {
		return device.Planned{}, &NotPublishedError{Device: r.Device}
	}
	cfg, err := configFor(configs, r.Request, dev.Kind.Type())
	if err != nil {
		return device.Planned{}, err
	}
	p := device.Planned{Result: r, Device: dev, Config: cfg, ClassCaps: classCapsFor(configs, r.Request, dev.Kind.Type())}
	if p.AdminAccess() {
		return p, nil // monitoring never changes a GPU's settings
	}
	if p.Sharing, err = dev.Kind.PlanSharing(p); err != nil {
		return device.Planned{}, fmt.Errorf("device %s (request %q): %w", dev.Name(), r.Request, err)
	}
	return p, nil
}

// prepareDevices sets the devices up (MIG instances, sharing settings),
// writes the claim's CDI spec, then its checkpoint record. When set-up changes the GPU, the
// record is written first (PrepareStarted), so a crash half-way is undone at
// restart; otherwise a crash leaves at most a CDI spec without a record,
// which Restore deletes. A failure rolls back everything done so far.
func (s *State) prepareDevices(ctx context.Context, claim *resourceapi.ResourceClaim, plan []device.Planned) (*checkpoint.Claim, error) {
	rec := newRecord(claim, plan)
	rec.BootID = s.bootID
	if changesGPUs(plan) {
		// Staged: a process crash keeps it, a power loss also resets what
		// set-up changes (checkpoint.Store.Stage). Only the completed
		// record, which the kubelet is then told of, is saved durably.
		if err := s.env.Store.Stage(rec); err != nil {
			return nil, err
		}
	}
	err := s.setUpAll(ctx, plan, rec)
	if err == nil {
		err = s.writeSpec(plan, rec)
	}
	if err == nil {
		rec.State = checkpoint.PrepareCompleted
		if err = s.env.Store.Save(rec); err != nil {
			_ = s.cdi.DeleteClaimSpec(rec.UID)
		}
	}
	if err != nil {
		// The kubelet cancels the call when it gives up on it; the rollback
		// must finish all the same.
		if rbErr := s.tearDown(context.WithoutCancel(ctx), rec); rbErr != nil {
			return nil, errors.Join(err, fmt.Errorf("rolling back: %w", rbErr))
		}
		_ = s.env.Store.Delete(rec.UID)
		return nil, err
	}
	return rec, nil
}

// changesGPUs reports whether setting the plan up may change a GPU, which
// must be recorded before it happens.
func changesGPUs(plan []device.Planned) bool {
	return slices.ContainsFunc(plan, func(p device.Planned) bool { return p.Device.Kind.ChangesGPU(p) })
}

// setUpAll sets each device of the plan up, as its kind does, recording
// in rec what an undo must know; a device's kind may replace it in the
// plan with the device as it is now (a re-bound GPU). Admin access changes
// no GPU.
func (s *State) setUpAll(ctx context.Context, plan []device.Planned, rec *checkpoint.Claim) error {
	for i := range plan {
		if err := plan[i].Device.Kind.SetUp(ctx, &s.env, &plan[i], rec, i); err != nil {
			return err
		}
	}
	return nil
}

func newRecord(claim *resourceapi.ResourceClaim, plan []device.Planned) *checkpoint.Claim {
	rec := &checkpoint.Claim{UID: string(claim.UID), Namespace: claim.Namespace, Name: claim.Name, State: checkpoint.PrepareStarted,
		Pods: ReservedPods(claim)}
	for _, p := range plan {
		rec.Devices = append(rec.Devices, checkpoint.Device{
			Requests:         []string{p.Result.Request},
			Pool:             p.Result.Pool,
			Device:           p.Result.Device,
			GPUUUID:          p.Device.GPU.UUID,
			AdminAccess:      p.AdminAccess(),
			GPUMode:          p.Device.Kind.ModeName(),
			Shared:           p.Device.MultiAllocatable(),
			ShareID:          string(ptr.Deref(p.Result.ShareID, "")),
			Sharing:          p.Sharing.SettingsOrNil(),
			MPSLimits:        p.Sharing.LimitsOrNil(),
			DeviceClass:      RequestDeviceClass(claim, p.Result.Request),
			GPUShare:         heldShare(p),
			MemoryLimitBytes: p.Sharing.MemoryLimitBytes(),
		})
	}
	return rec
}

// ReservedPods are the pods the claim is reserved for, as the use sampler
// maps a shared GPU's processes to claims.
func ReservedPods(claim *resourceapi.ResourceClaim) []checkpoint.Pod {
	var pods []checkpoint.Pod
	for _, r := range claim.Status.ReservedFor {
		if r.Resource == "pods" && r.APIGroup == "" {
			pods = append(pods, checkpoint.Pod{UID: string(r.UID), Name: r.Name})
		}
	}
	return pods
}

// RequestDeviceClass is the DeviceClass of the claim's request (a
// subrequest "<request>/<sub>" of firstAvailable has its own); "" if the
// claim names none.
func RequestDeviceClass(claim *resourceapi.ResourceClaim, request string) string {
	main, sub, _ := strings.Cut(request, "/")
	for _, r := range claim.Spec.Devices.Requests {
		if r.Name != main {
			continue
		}
		if r.Exactly != nil {
			return r.Exactly.DeviceClassName
		}
		for _, s := range r.FirstAvailable {
			if s.Name == sub {
				return s.DeviceClassName
			}
		}
	}
	return ""
}

// heldShare is the part of its GPU the planned device holds for the
// claim (checkpoint.Device.GPUShare).
func heldShare(p device.Planned) float64 {
	var memory int64
	if q, ok := p.Result.ConsumedCapacity["memory"]; ok {
		memory = q.Value()
	}
	return deviceweight.Held(&p.Device.API, configapi.DriverName, memory).Float64()
}

// writeSpec writes the claim's CDI spec and records the CDI device IDs.
func (s *State) writeSpec(plan []device.Planned, rec *checkpoint.Claim) error {
	devs, err := s.cdiDevices(plan, rec)
	if err != nil {
		return err
	}
	ids, err := s.cdi.WriteClaimSpec(rec.UID, devs)
	if err != nil {
		return fmt.Errorf("writing CDI spec: %w", err)
	}
	for i, p := range plan {
		rec.Devices[i].CDIDeviceIDs = []string{ids[p.Device.Name()]}
	}
	return nil
}

// cdiDevices lists each device once, even when several requests of the
// claim got the same device (admin access), as its kind gives it.
func (s *State) cdiDevices(plan []device.Planned, rec *checkpoint.Claim) ([]cdi.Device, error) {
	seen := map[string]bool{}
	var out []cdi.Device
	for i, p := range plan {
		if seen[p.Device.Name()] {
			continue
		}
		seen[p.Device.Name()] = true
		d, err := p.Device.Kind.CDIDevice(&s.env, p, &rec.Devices[i])
		if err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	return out, nil
}

// lostErr is the error of preparing a claim whose record says it was lost
// in a reboot; nil for any other record.
func lostErr(rec *checkpoint.Claim) error {
	if rec == nil || rec.State != checkpoint.PrepareLost {
		return nil
	}
	return fmt.Errorf("claim %s: %w (%s); delete the pods using it so that it is allocated again",
		klog.KRef(rec.Namespace, rec.Name), ErrLostInReboot, rec.Lost)
}

// NotPublishedError refuses a device this node does not publish: the claim
// was allocated it before the node configuration changed how its GPU is
// offered (or before the GPU went), and is stranded on it. No retry helps;
// a new allocation does.
type NotPublishedError struct{ Device string }

func (e *NotPublishedError) Error() string {
	return fmt.Sprintf("device %q is not published by this node: the claim was allocated it before the node's configuration "+
		"(or its GPUs) changed; delete the claim (for a template's claim, its pod) so that it is allocated again", e.Device)
}
