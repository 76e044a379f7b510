package plugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	metaapply "k8s.io/client-go/applyconfigurations/meta/v1"
	resourceapply "k8s.io/client-go/applyconfigurations/resource/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	gpuaasv1 "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/health"
	"github.com/gpuaas/gpu-dra-driver/pkg/mig"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/checkpoint"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/device"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/inventory"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/prepare"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/usage"
	"github.com/gpuaas/gpu-dra-driver/pkg/timeslice"
)

// statusFieldManager owns the driver's entries of status.devices (KEP-4817).
const statusFieldManager = "gpu.gpuaas.io/kubelet-plugin"

// Device status condition types and reasons.
const (
	condReady   = "Ready"
	condHealthy = "Healthy"
	// reasonDeviceNotPublished: the claim was allocated a device the node
	// no longer publishes (its GPU's mode changed since): it is stranded,
	// and only a new allocation helps.
	reasonDeviceNotPublished = "DeviceNotPublished"
)

// DeviceStatusData is what status.devices[].data says of one of our
// devices: which hardware it is and the settings in force, what a user or
// an operator needs to find the GPU behind a pod.
type DeviceStatusData struct {
	GPUUUID string `json:"gpuUUID"`
	// Mode is how the GPU is offered: "whole", "mig-static", "mig-dynamic",
	// "timeSlicing/<replicas>", "shared".
	Mode         string         `json:"mode"`
	MIGUUID      string         `json:"migUUID,omitempty"`
	MIGProfile   string         `json:"migProfile,omitempty"`
	MIGPlacement *mig.Placement `json:"migPlacement,omitempty"`
	// MIGGPUInstanceID and MIGComputeInstanceID are what nvidia-smi and
	// NVML events (XIDs) name the MIG device by.
	MIGGPUInstanceID     *int                `json:"migGPUInstanceID,omitempty"`
	MIGComputeInstanceID *int                `json:"migComputeInstanceID,omitempty"`
	Sharing              *timeslice.Settings `json:"sharing,omitempty"`
}

// failedPrepare is what a failed prepare leaves for the claim's status.
type failedPrepare struct {
	namespace, name string
	results         []resourceapi.DeviceRequestAllocationResult
	err             error
}

// statusWriter keeps status.devices of the claims prepared on this node: a
// Ready condition (prepared, or why not), a Healthy condition (the faults
// of the device) and the device's data. It works off a queue of claim UIDs
// so that prepare never waits for the API; each write is a server-side
// apply of all of our entries of one claim, with the claim's UID as a
// precondition (a claim deleted and made again under the same name is not
// written to).
type statusWriter struct {
	client  kubernetes.Interface
	node    string
	store   *checkpoint.Store
	devices func() map[string]*device.AllocatableDevice
	faults  func() []health.Fault
	// idle is the Idle condition the use sampler judged for a device; nil
	// (no sampler) writes none.
	idle  func(uid types.UID, device, shareID string) (usage.Condition, bool)
	queue workqueue.TypedRateLimitingInterface[types.UID]

	mu       sync.Mutex
	failures map[types.UID]failedPrepare
	// since keeps each condition's last transition, by claim, then by
	// device, type and status, so that rewriting an unchanged condition
	// keeps it. What a claim has here goes when it is unprepared or gone
	// (forget).
	since map[types.UID]map[string]metav1.Time
}

func newStatusWriter(client kubernetes.Interface, node string, store *checkpoint.Store, devices func() map[string]*device.AllocatableDevice, faults func() []health.Fault) *statusWriter {
	return &statusWriter{client: client, node: node, store: store, devices: devices, faults: faults,
		queue:    workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[types.UID](), workqueue.TypedRateLimitingQueueConfig[types.UID]{Name: "device-status"}),
		failures: map[types.UID]failedPrepare{}, since: map[types.UID]map[string]metav1.Time{}}
}

// unprepared forgets a claim unprepared on this node: there is no status
// of ours to keep for it any more.
func (w *statusWriter) unprepared(uid types.UID) {
	if w == nil {
		return
	}
	w.forget(uid)
}

// forget drops what the writer keeps of a claim.
func (w *statusWriter) forget(uid types.UID) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.failures, uid)
	delete(w.since, uid)
}

// idleChanged queues a write of a claim whose Idle condition changed.
func (w *statusWriter) idleChanged(uid types.UID) {
	if w == nil {
		return
	}
	w.queue.Add(uid)
}

// prepared queues a write after a prepare; err is the prepare's error.
func (w *statusWriter) prepared(claim *resourceapi.ResourceClaim, err error) {
	if w == nil {
		return
	}
	w.mu.Lock()
	delete(w.failures, claim.UID)
	if err != nil && claim.Status.Allocation != nil {
		w.failures[claim.UID] = failedPrepare{namespace: claim.Namespace, name: claim.Name,
			results: claim.Status.Allocation.Devices.Results, err: err}
	}
	w.mu.Unlock()
	w.queue.Add(claim.UID)
}

// all queues a write of every prepared claim (at start, and when the
// faults change).
func (w *statusWriter) all(ctx context.Context) {
	if w == nil {
		return
	}
	records, _, err := w.store.List()
	if err != nil {
		klog.FromContext(ctx).Error(err, "Listing prepared claims for their device status")
		return
	}
	for _, rec := range records {
		w.queue.Add(types.UID(rec.UID))
	}
}

// run writes statuses until ctx ends.
func (w *statusWriter) run(ctx context.Context) {
	logger := klog.FromContext(ctx).WithName("device-status")
	go func() {
		<-ctx.Done()
		w.queue.ShutDown()
	}()
	for {
		uid, quit := w.queue.Get()
		if quit {
			return
		}
		err := w.write(klog.NewContext(ctx, logger), uid)
		switch {
		case err == nil:
			w.queue.Forget(uid)
		case apierrors.IsNotFound(err) || apierrors.IsConflict(err):
			// The claim is gone or was made again: nothing to do, nothing
			// to keep.
			w.queue.Forget(uid)
			w.forget(uid)
		default:
			logger.Error(err, "Writing device status", "claimUID", uid)
			w.queue.AddRateLimited(uid)
		}
		w.queue.Done(uid)
	}
}

// write applies the claim's device status.
func (w *statusWriter) write(ctx context.Context, uid types.UID) error {
	claim, err := w.desired(uid)
	if err != nil || claim == nil {
		return err
	}
	_, err = w.client.ResourceV1().ResourceClaims(*claim.Namespace).ApplyStatus(ctx, claim,
		metav1.ApplyOptions{FieldManager: statusFieldManager, Force: true})
	if err != nil {
		return fmt.Errorf("applying status of claim %s/%s: %w", *claim.Namespace, *claim.Name, err)
	}
	klog.FromContext(ctx).V(4).Info("Device status written", "claim", klog.KRef(*claim.Namespace, *claim.Name))
	return nil
}

// desired is the claim's device status as an apply configuration; nil
// when there is nothing to write (unprepared meanwhile).
func (w *statusWriter) desired(uid types.UID) (*resourceapply.ResourceClaimApplyConfiguration, error) {
	w.mu.Lock()
	failure, failed := w.failures[uid]
	w.mu.Unlock()
	if failed {
		return w.failedStatus(uid, failure), nil
	}
	rec, err := w.store.Load(string(uid))
	if err != nil {
		return nil, fmt.Errorf("reading the record of claim %s: %w", uid, err)
	}
	if rec == nil || rec.State != checkpoint.PrepareCompleted {
		return nil, nil
	}
	status := resourceapply.ResourceClaimStatus()
	faults := w.faults()
	for i := range rec.Devices {
		status.WithDevices(w.preparedEntry(rec, &rec.Devices[i], faults))
	}
	return resourceapply.ResourceClaim(rec.Name, rec.Namespace).WithUID(uid).WithStatus(status), nil
}

func (w *statusWriter) preparedEntry(rec *checkpoint.Claim, d *checkpoint.Device, faults []health.Fault) *resourceapply.AllocatedDeviceStatusApplyConfiguration {
	entry := resourceapply.AllocatedDeviceStatus().WithDriver(configapi.DriverName).WithPool(d.Pool).WithDevice(d.Device)
	if d.ShareID != "" {
		entry.WithShareID(d.ShareID)
	}
	data, _ := json.Marshal(statusData(d)) // plain struct: cannot fail
	entry.WithData(runtime.RawExtension{Raw: data})
	uid, key := types.UID(rec.UID), d.Device+"/"+d.ShareID
	entry.WithConditions(w.condition(uid, key, condReady, metav1.ConditionTrue, "Prepared", "prepared for containers (CDI devices "+strings.Join(d.CDIDeviceIDs, ", ")+")"))
	var msgs []string
	dev := w.devices()[d.Device]
	if dev == nil {
		// A device of a GPU not enumerated (lost before this start) is not
		// published, but its GPU's faults still concern the claim.
		dev = &device.AllocatableDevice{GPU: nvdev.GPU{UUID: d.GPUUUID}}
	}
	for _, f := range inventory.FaultsOf(dev, faults) {
		if f.Unhealthy() {
			msgs = append(msgs, f.String())
		}
	}
	if len(msgs) == 0 {
		entry.WithConditions(w.condition(uid, key, condHealthy, metav1.ConditionTrue, "NoFault", "no fault seen on the device"))
	} else {
		sort.Strings(msgs)
		entry.WithConditions(w.condition(uid, key, condHealthy, metav1.ConditionFalse, "DeviceFault", strings.Join(msgs, "; ")))
	}
	// In the same apply, or the field manager's next apply drops it.
	if w.idle != nil {
		if c, ok := w.idle(uid, d.Device, d.ShareID); ok {
			entry.WithConditions(metaapply.Condition().WithType(gpuaasv1.DeviceConditionIdle).WithStatus(c.Status).
				WithReason(c.Reason).WithMessage(c.Message).WithLastTransitionTime(metav1.NewTime(c.Since)))
		}
	}
	return entry
}

// statusData describes a prepared device.
func statusData(d *checkpoint.Device) DeviceStatusData {
	out := DeviceStatusData{GPUUUID: d.GPUUUID, Mode: d.GPUMode, Sharing: d.Sharing}
	if out.Mode == "" {
		out.Mode = "whole"
	}
	if d.GPUMode == string(configapi.MigStatic) || d.GPUMode == string(configapi.MigDynamic) {
		out.Mode = "mig-" + d.GPUMode
	}
	if m := d.CreatedMIG; m != nil {
		out.MIGUUID, out.MIGProfile, out.MIGPlacement = m.UUID, m.Profile, &m.Placement
		out.MIGGPUInstanceID, out.MIGComputeInstanceID = &m.GIID, &m.CIID
	}
	return out
}

// failedStatus says, on every device of ours the claim was allocated on
// this node, why preparing it failed.
func (w *statusWriter) failedStatus(uid types.UID, f failedPrepare) *resourceapply.ResourceClaimApplyConfiguration {
	status := resourceapply.ResourceClaimStatus()
	for _, r := range f.results {
		if r.Driver != configapi.DriverName || r.Pool != w.node {
			continue
		}
		entry := resourceapply.AllocatedDeviceStatus().WithDriver(r.Driver).WithPool(r.Pool).WithDevice(r.Device)
		if r.ShareID != nil {
			entry.WithShareID(string(*r.ShareID))
		}
		key := r.Device + "/" + string(ptr.Deref(r.ShareID, ""))
		reason := "PrepareFailed"
		if stranded := (*prepare.NotPublishedError)(nil); errors.As(f.err, &stranded) {
			reason = reasonDeviceNotPublished
		}
		entry.WithConditions(w.condition(uid, key, condReady, metav1.ConditionFalse, reason, truncate(f.err.Error(), 4096)))
		status.WithDevices(entry)
	}
	return resourceapply.ResourceClaim(f.name, f.namespace).WithUID(uid).WithStatus(status)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-3] + "..."
}

// condition builds a condition of the claim uid's device key whose
// transition time is kept while its status stays the same.
func (w *statusWriter) condition(uid types.UID, key, typ string, status metav1.ConditionStatus, reason, msg string) *metaapply.ConditionApplyConfiguration {
	w.mu.Lock()
	defer w.mu.Unlock()
	claimSince := w.since[uid]
	if claimSince == nil {
		claimSince = map[string]metav1.Time{}
		w.since[uid] = claimSince
	}
	k := key + "/" + typ + "/" + string(status)
	since, ok := claimSince[k]
	if !ok {
		since = metav1.NewTime(time.Now().Truncate(time.Second))
		claimSince[k] = since
		// The other status of this condition transitions now.
		for _, other := range []metav1.ConditionStatus{metav1.ConditionTrue, metav1.ConditionFalse} {
			if other != status {
				delete(claimSince, key+"/"+typ+"/"+string(other))
			}
		}
	}
	return metaapply.Condition().WithType(typ).WithStatus(status).WithReason(reason).WithMessage(msg).WithLastTransitionTime(since)
}
