// Package plugin is the kubelet's side of the node plugin: the DRA gRPC
// service and its registration, publishing the inventory, the device
// health stream and status, and the planes it wires (inventory, prepare,
// device kinds, telemetry, taking the GPUs out of service and back in
// maintenance, standing aside for a device plugin in coexist).
package plugin

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/device"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/inventory"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/prepare"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/telemetry"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/usage"
	"github.com/gpuaas/gpu-dra-driver/pkg/sliceprobe"
	"path/filepath"
	"sync"
	"time"

	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/health"
	"github.com/gpuaas/gpu-dra-driver/pkg/listen"
	"github.com/gpuaas/gpu-dra-driver/pkg/mps"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/checkpoint"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/coexist"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/maintenance"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/events"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
)

// Options configure the kubelet plugin.
type Options struct {
	NodeName   string
	KubeClient kubernetes.Interface
	NVML       nvdev.Interface
	CDI        prepare.CDIWriter
	// NodeConfig says how each GPU is offered; nil offers every GPU whole.
	NodeConfig    *configapi.NodeConfig
	PluginDataDir string // dra.sock and the checkpoint
	RegistrarDir  string // the kubelet's plugins_registry
	// PodUID enables kubeletplugin's rolling update (two plugin pods on a
	// node during an update); empty disables it.
	PodUID  types.UID
	Metrics *telemetry.Metrics
	// DriverRoot is where the driver's tools (nvidia-smi for time-slice
	// intervals, nvidia-cuda-mps-control for MPS) are looked up. Empty
	// means none: replicas and shares with the Default interval still
	// work; claims asking for more fail at prepare, saying why.
	DriverRoot string
	// MPSLauncher runs the MPS control daemons; nil runs them as
	// background processes of the plugin (see mps.ProcessLauncher).
	MPSLauncher mps.Launcher
	// MPSShm provides each MPS GPU's shared memory (a sized tmpfs where the
	// daemons run in pods); nil keeps a plain directory.
	MPSShm mps.ShmMounter
	// BootIDPath is where the node's boot ID is read (a simulated node
	// fakes its reboots there); empty means DefaultBootIDPath.
	BootIDPath string
	// Events records warnings on the Node (dynamic MIG withdrawn, MIG
	// devices no claim owns); nil records none.
	Events events.EventRecorder
	// Health watches the GPUs; its faults become device taints and the
	// kubelet's device health. Nil: no health monitoring (the kubelet is
	// told so).
	Health *health.Monitor
	// Steps follows the start (the health endpoint's answers while it
	// runs); nil tells nobody.
	Steps prepare.StepRecorder
	// StaticMIGResync is how often static-MIG GPUs' layouts are read
	// again (MIG devices an admin makes after the start), and every GPU's
	// minor number (a GPU re-bound from outside); zero is
	// DefaultStaticMIGResync, negative never.
	StaticMIGResync time.Duration
	// Maintenance lets an operator take the GPUs from the running plugin
	// for a reset or a driver upgrade, and the plugin follow the driver's
	// version (package maintenance).
	Maintenance maintenance.Options
	// DevicePlugins says what to do while a device plugin hands out the
	// node's GPUs too (package coexist); the zero value does not look.
	DevicePlugins coexist.DevicePluginCheck
	// ClusterProbeInterval is how often the API server's version is
	// checked, to ask again what it keeps of the slices (clustersupport.go);
	// zero is DefaultClusterProbeInterval, negative never.
	ClusterProbeInterval time.Duration
	// Usage configures the sampling of the prepared devices' use.
	Usage UsageOptions
}

// UsageOptions configure the use sampler (package usage) and its Lease.
type UsageOptions struct {
	// Interval between samples; zero is usage.DefaultInterval, negative
	// samples nothing (no Idle condition, no Lease).
	Interval time.Duration
	// Window is the length of a judged window; zero is usage.DefaultWindow.
	Window   time.Duration
	ProcRoot string
	// Thresholds resolve each claim's idle threshold; nil: 0.
	Thresholds usage.Thresholds
	// Tenants name each claim's tenant, the use metrics' tenant label;
	// nil: "".
	Tenants usage.Tenants
	Metrics *usage.Metrics
	// Namespace is the plugin's, where the use Lease is renewed; empty
	// renews none. Holder names this process in it, Started is when it
	// started.
	Namespace string
	Holder    string
	Started   time.Time
}

// Driver implements kubeletplugin.DRAPlugin over a State.
type Driver struct {
	state    *prepare.State
	helper   *kubeletplugin.Helper
	nodeName string
	metrics  *telemetry.Metrics
	// socket is the DRA gRPC socket the kubelet calls, which the health
	// check calls too.
	socket string

	// mu guards what is published: HandleError runs on the slice
	// controller's goroutine and may change it (see withdrawDynamicMIG).
	mu  sync.Mutex
	inv inventory.Inventory
	pub publisher
	// withdrawn: counters are no longer published (nor dynamic MIG, whose
	// devices only counters keep apart), because the cluster drops them.
	withdrawn bool
	// support is what the cluster keeps of the slices; nil (tests that
	// build a Driver by hand) is sliceprobe.Full.
	support *sliceprobe.Support

	health *health.Monitor
	// reregister has the health monitor register the GPUs for events
	// again after a re-bind (rebind.go); set before the restore, which
	// may re-bind, nil without a monitor.
	reregister func()
	// orphans are prepared devices on GPUs not enumerated (lost before
	// this start): not published, but their health is still reported.
	orphans []device.AllocatableDevice
	// status writes the prepared claims' device status; nil without a
	// client (tests).
	status *statusWriter
	// healthChanged is closed (and replaced) when the faults change, which
	// wakes every health stream at once.
	healthChanged chan struct{}
	// maint: the GPUs released for maintenance, or not; nil: never.
	maint  *maintenance.Maintenance
	events telemetry.NodeEvents
	// dp withholds the GPUs a device plugin hands out; nil: no check.
	dp *coexist.Watch
	// checked is closed when the start's check of the prepared claims
	// against the API is done; the kubelet's calls wait for it.
	checked <-chan struct{}
	// store is the checkpoint of prepared claims.
	store *checkpoint.Store
	// client is the API client; nil in tests that have none.
	client kubernetes.Interface
	// usage samples the prepared devices' use; nil: not sampled.
	usage *usage.Sampler
	// deferred are the busy GPUs whose configured mode waits for their
	// last claim (deferredmodes.go); guarded by mu.
	deferred *deferredModes
}

// gpuUUIDs are the UUIDs of gpus.
func gpuUUIDs(gpus []nvdev.GPU) []string {
	out := make([]string, 0, len(gpus))
	for _, g := range gpus {
		out = append(out, g.UUID)
	}
	return out
}

// publisher is what Driver needs of the kubelet plugin helper to publish
// slices; an interface so that tests see what is published.
type publisher interface {
	PublishResources(ctx context.Context, resources resourceslice.DriverResources) error
}

var _ kubeletplugin.DRAPlugin = (*Driver)(nil)

// Start restores the node's prepared claims, starts the kubelet plugin and
// publishes the node's devices.
func Start(ctx context.Context, opts Options) (*Driver, error) {
	logger := klog.FromContext(ctx)
	steps := cmp.Or[prepare.StepRecorder](opts.Steps, prepare.NoSteps{})
	steps.Step(ctx, "loading the checkpoint of prepared claims")
	store, err := checkpoint.NewStore(filepath.Join(opts.PluginDataDir, "claims"))
	if err != nil {
		return nil, err
	}
	// Under the GPUs' locks, as the old instance of a rolling update may be
	// preparing: the modes are pinned from them. Read-only: Restore reads
	// the records again.
	lockDir := filepath.Join(opts.PluginDataDir, "locks")
	records, err := prepare.RecordsUnderLocks(ctx, lockDir, gpuUUIDs(opts.NVML.GPUs()), store)
	if err != nil {
		return nil, fmt.Errorf("reading the prepared claims: %w", err)
	}
	steps.Step(ctx, "discovering devices")
	cfg, pinned := device.PinModes(logger, cmp.Or(opts.NodeConfig, &configapi.NodeConfig{}), opts.NVML.GPUs(), records)
	d := &Driver{inv: inventory.Discover(logger, opts.NVML, cfg), metrics: opts.Metrics, nodeName: opts.NodeName,
		socket: filepath.Join(opts.PluginDataDir, SocketName(opts.PluginDataDir, opts.PodUID))}
	sharing := device.NewSharing(device.SharingOptions{DriverRoot: opts.DriverRoot, MPSDir: device.MPSDir(opts.PluginDataDir), NVML: opts.NVML,
		MPSLauncher: opts.MPSLauncher, MPSShm: opts.MPSShm})
	events := telemetry.NewNodeEvents(ctx, opts.Events, opts.KubeClient, opts.NodeName)
	reportPinned(events, opts.Metrics, device.ConfiguredModes(cmp.Or(opts.NodeConfig, &configapi.NodeConfig{}), opts.NVML.GPUs()), pinned)
	d.deferred = &deferredModes{nvml: opts.NVML, config: cmp.Or(opts.NodeConfig, &configapi.NodeConfig{}), pending: pinned,
		memoryLimits: memoryLimitsOf(opts.CDI).Enforced}
	d.inv = withMemoryLimits(ctx, d.inv, opts.CDI, events, opts.Metrics)
	d.startMaintenance(ctx, opts, events)
	stateCfg := prepare.StateConfig{NodeName: opts.NodeName, Devices: d.inv.Devices, NVML: opts.NVML,
		CDI: opts.CDI, Store: store, Metrics: opts.Metrics, Sharing: sharing, LockDir: lockDir,
		BootIDPath: opts.BootIDPath, Events: events, Steps: steps}
	var missing inventory.MissingGPUs
	if opts.Health != nil {
		stateCfg.Faults = opts.Health
		missing = opts.Health
	}
	d.state = prepare.NewState(stateCfg)
	d.state.OnRebound(d.gpuRebound)
	if opts.Health != nil {
		d.reregister = opts.Health.Reregister
	}
	// One bad GPU is reported, not fatal: the others are published, and
	// claims prepared on it are still unprepared (and told of its loss).
	problems := inventory.FindGPUProblems(opts.NVML, records)
	problems.Report(ctx, events, opts.Metrics, missing)
	d.orphans = problems.Orphans
	checked := make(chan struct{})
	d.checked, d.store, d.client = checked, store, opts.KubeClient
	d.usage = newSampler(opts, d)
	// Read by the kubelet's health stream, which may start at once.
	d.health = opts.Health
	// State.Restore's order: the records, registering with the kubelet
	// (whose calls wait for checked), the check of the claims against the
	// API, withholding what MIG devices no claim owns occupy.
	steps.Step(ctx, fmt.Sprintf("restoring %d prepared claims", len(records)))
	inv, err := d.state.Restore(ctx, opts.KubeClient, d.inv, func(ctx context.Context) error {
		steps.Step(ctx, "starting the kubelet plugin")
		if d.helper, err = kubeletplugin.Start(ctx, d, helperOptions(opts)...); err != nil {
			return fmt.Errorf("starting kubelet plugin: %w", err)
		}
		steps.Step(ctx, "checking the prepared claims against the API")
		return nil
	})
	if err != nil {
		return nil, err
	}
	d.checkedClaims(ctx, opts, store, inv)
	close(checked)
	// Every prepared device starts Unknown/NoSamples: a restarted plugin
	// has not seen the past.
	d.trackPrepared(ctx)
	d.status.all(ctx) // after a restart or an upgrade
	// Counted before publishing: from then on HandleError may change d.inv.
	devices, counterSets := len(d.inv.Devices), len(d.inv.CounterSets)
	steps.Step(ctx, "publishing devices")
	// Asked before anything publishes (the health monitor's changes do):
	// GPUs a device plugin hands out are never offered, not for a moment.
	d.dp = coexist.NewWatch(opts.DevicePlugins, opts.NVML, events, opts.Metrics)
	d.checkDevicePlugins(ctx, false)
	d.watchHealth(ctx)
	probe := newClusterProbe(opts)
	d.learnClusterSupport(ctx, probe)
	if err := d.publish(ctx); err != nil {
		d.helper.Stop()
		return nil, err
	}
	d.watchStaticMIG(ctx, opts.NVML, cfg, opts.StaticMIGResync)
	d.maint.Watch(ctx)
	d.watchDevicePlugins(ctx)
	d.watchClusterSupport(ctx, probe)
	d.startUsage(ctx, opts)
	if opts.KubeClient != nil {
		watchOwnSlices(ctx, opts.KubeClient, opts.NodeName, func(ctx context.Context) {
			if err := d.publish(ctx); err != nil {
				klog.FromContext(ctx).Error(err, "Publishing again after a slice of this node was deleted")
			}
		})
	}
	logger.Info("Kubelet plugin started", "node", opts.NodeName, "devices", devices, "counterSets", counterSets)
	return d, nil
}

// checkedClaims sets up, once State.Restore is done, what the kubelet's
// calls use: the inventory less the placements of MIG devices that no
// claim owns (inv), the publisher and the status writer. Restore's check
// of the prepared claims against the API is made once the kubelet can
// reach the plugin: the kubelet's calls wait for it (waitChecked) instead
// of failing with "not registered" and retrying after its backoff. The
// check costs what the API server answers in: 100 claims took about
// 100 ms on a 2-core machine, as much as the rest of the start
// (BenchmarkPeerRestart, issue 37).
func (d *Driver) checkedClaims(ctx context.Context, opts Options, store *checkpoint.Store, inv inventory.Inventory) {
	d.mu.Lock()
	d.inv = inv
	d.pub = d.helper
	d.mu.Unlock()
	if opts.KubeClient != nil {
		d.status = newStatusWriter(opts.KubeClient, opts.NodeName, store, d.state.DeviceMap, d.faults)
		if d.usage != nil {
			d.status.idle = d.usage.Condition
		}
		go d.status.run(ctx)
	}
}

// waitChecked holds a call of the kubelet until the start's check of the
// prepared claims is done: a prepare must not take a device that a claim
// deleted while the plugin was down still holds, nor an unprepare race the
// check's own. A Driver built without Start (tests) has nothing to wait for.
func (d *Driver) waitChecked(ctx context.Context) error {
	if d.checked == nil {
		return nil
	}
	select {
	case <-d.checked:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("waiting for the start's check of prepared claims: %w", context.Cause(ctx))
	}
}

// publish hands the inventory to the slice controller.
func (d *Driver) publish(ctx context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.publishLocked(ctx)
}

// publishLocked publishes what may be offered (publishable) in the shape
// the cluster keeps (ForCluster, TaintsFor), with the faults as taints.
func (d *Driver) publishLocked(ctx context.Context) error {
	support := d.clusterSupport()
	inv := d.publishable().ForCluster(support).WithFaults(d.faults()).TaintsFor(support)
	if err := d.pub.PublishResources(ctx, inventory.Resources(d.nodeName, inv)); err != nil {
		return fmt.Errorf("publishing devices: %w", err)
	}
	d.metrics.SetPublished(inv.Devices)
	return nil
}

// maxSocketPath is the longest path a Unix socket can be bound at on Linux
// (sun_path is 108 bytes with the terminating NUL).
const maxSocketPath = 107

// SocketName is the file name of the DRA socket in the plugin data
// directory dir. Under a rolling update every plugin pod needs its own
// socket, so the pod UID is part of the name, and the health check must
// call that socket, not "dra.sock" (it did, failed forever, and the kubelet
// killed the plugin every 40 s). Where the kubelet's root dir is long
// (/var/snap/microk8s/common/var/lib/kubelet, or a test's temp dir) the
// UID would push the path past what bind() accepts; a hash of the UID
// keeps the name unique and short.
func SocketName(dir string, podUID types.UID) string {
	if podUID == "" {
		return "dra.sock"
	}
	name := "dra-" + string(podUID) + ".sock"
	if len(filepath.Join(dir, name)) <= maxSocketPath {
		return name
	}
	sum := sha256.Sum256([]byte(podUID))
	return "dra-" + base64.RawURLEncoding.EncodeToString(sum[:9]) + ".sock"
}

func helperOptions(opts Options) []kubeletplugin.Option {
	o := []kubeletplugin.Option{
		kubeletplugin.DriverName(configapi.DriverName),
		kubeletplugin.KubeClient(opts.KubeClient),
		kubeletplugin.NodeName(opts.NodeName),
		kubeletplugin.PluginDataDirectoryPath(opts.PluginDataDir),
		kubeletplugin.PluginSocket(SocketName(opts.PluginDataDir, opts.PodUID)),
		kubeletplugin.RegistrarDirectoryPath(opts.RegistrarDir),
		// The registration socket appears only once it is served: the
		// kubelet dials it at its creation, and one refused dial costs
		// its backoff and a reconcile pass (a second or more).
		kubeletplugin.RegistrarListener(listen.UnixWhenServed),
	}
	if opts.PodUID != "" {
		// Two plugin processes share the checkpoint during a rolling update.
		o = append(o, kubeletplugin.RollingUpdate(opts.PodUID))
	}
	// State's per-GPU file locks keep calls on one GPU from interleaving,
	// in this process and with the other instance of a rolling update; the
	// helper's lock would serialize every call on the node.
	return append(o, kubeletplugin.Serialize(false))
}

// Stop stops serving the kubelet. Published slices stay: the kubelet plugin
// coming back republishes them, and they go with the Node.
func (d *Driver) Stop() {
	if d.helper != nil {
		d.helper.Stop()
	}
}

// Helper exposes the kubelet plugin helper, for health checks.
func (d *Driver) Helper() *kubeletplugin.Helper { return d.helper }

// SocketPath is the DRA gRPC socket the kubelet calls.
func (d *Driver) SocketPath() string { return d.socket }

// PrepareResourceClaims implements kubeletplugin.DRAPlugin.
func (d *Driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	if err := d.waitChecked(ctx); err != nil {
		return nil, err
	}
	results := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, claim := range claims {
		logger := klog.FromContext(ctx).WithValues("claim", klog.KObj(claim), "claimUID", claim.UID)
		devices, err := d.prepareClaim(ctx, claim)
		if err != nil {
			logger.Error(err, "Preparing claim failed")
			d.reportStranded(claim, err)
			err = fmt.Errorf("preparing claim %s: %w", klog.KObj(claim), err)
		}
		results[claim.UID] = kubeletplugin.PrepareResult{Err: err, Devices: devices}
		if err == nil {
			d.trackClaim(ctx, claim)
		}
		d.status.prepared(claim, err)
	}
	return results, nil
}

// prepareClaim prepares one claim under the maintenance hold, taken for
// this claim alone: a release waits for it, not for the rest of the
// kubelet's call, whose claims it refuses meanwhile.
func (d *Driver) prepareClaim(ctx context.Context, claim *resourceapi.ResourceClaim) ([]kubeletplugin.Device, error) {
	release, err := d.maint.Hold(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	if err := d.maint.Refusal(); err != nil {
		return nil, err
	}
	// State adds the claim to the logger itself.
	return d.state.Prepare(ctx, claim)
}

// unprepareClaim unprepares one claim under the maintenance hold, taken
// for this claim alone (prepareClaim). While released, teardowns that need
// no NVML go on; the others fail saying the GPUs are released.
func (d *Driver) unprepareClaim(ctx context.Context, uid types.UID) error {
	release, err := d.maint.Hold(ctx)
	if err != nil {
		return err
	}
	defer release()
	return d.state.Unprepare(ctx, uid)
}

// UnprepareResourceClaims implements kubeletplugin.DRAPlugin.
func (d *Driver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	if err := d.waitChecked(ctx); err != nil {
		return nil, err
	}
	results := make(map[types.UID]error, len(claims))
	for _, claim := range claims {
		logger := klog.FromContext(ctx).WithValues("claim", claim.NamespacedName, "claimUID", claim.UID)
		err := d.unprepareClaim(klog.NewContext(ctx, logger), claim.UID)
		if err != nil {
			logger.Error(err, "Unpreparing claim failed")
			err = fmt.Errorf("unpreparing claim %s: %w", claim.NamespacedName, err)
		} else {
			d.usage.Forget(claim.UID)
			d.status.unprepared(claim.UID)
		}
		results[claim.UID] = err
	}
	d.applyDeferredModesHeld(ctx)
	return results, nil
}

// HandleError implements kubeletplugin.DRAPlugin. Publishing errors that
// retrying cannot fix (the API server rejects or drops our slices) are
// reported loudly; they mean this build and the cluster disagree. Dropped
// counters are acted on: see withdrawDynamicMIG.
func (d *Driver) HandleError(ctx context.Context, err error, msg string) {
	var dropped *resourceslice.DroppedFieldsError
	if errors.As(err, &dropped) && countersDropped(dropped) {
		d.withdrawDynamicMIG(ctx, dropped)
	}
	if !errors.Is(err, kubeletplugin.ErrRecoverable) {
		msg = "Non-recoverable error (check the cluster's Kubernetes version and feature gates): " + msg
	}
	utilruntime.HandleErrorWithContext(ctx, err, msg)
}

// reportStranded tells a claim allocated a device this node no longer
// publishes (prepare.NotPublishedError) so, with an event on the claim
// (kubectl describe resourceclaim; its device's Ready condition says it
// too): the kubelet would otherwise retry it, failing, for as long as its
// pod exists.
func (d *Driver) reportStranded(claim *resourceapi.ResourceClaim, err error) {
	var stranded *prepare.NotPublishedError
	if !errors.As(err, &stranded) {
		return
	}
	ref := &corev1.ObjectReference{APIVersion: resourceapi.SchemeGroupVersion.String(), Kind: "ResourceClaim",
		Namespace: claim.Namespace, Name: claim.Name, UID: claim.UID}
	d.events.WarnOn(ref, reasonDeviceNotPublished, "PrepareResourceClaims", "%s", stranded.Error())
}

// reportPinned says which busy GPUs keep their mode against the node
// configuration (device.PinModes): a Node event and the metric per GPU, so
// that a configuration change left unapplied is seen where it was made,
// not found at some later restart.
func reportPinned(events telemetry.NodeEvents, metrics *telemetry.Metrics, configured map[string]string, pinned []device.PinnedMode) {
	for _, p := range pinned {
		events.Warn(telemetry.ReasonModeChangeDeferred, "PublishResources",
			"GPU %d (%s) keeps its mode %q while claims hold it; the node configuration's %q applies when its last claim is unprepared",
			p.Index, p.UUID, modeOrWhole(p.Mode), modeOrWhole(p.Configured))
	}
	metrics.SetModeChangesDeferred(configured, pinned)
}

func modeOrWhole(m string) string {
	if m == "" {
		return "whole"
	}
	return m
}
