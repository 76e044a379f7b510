package plugin

import (
	"context"
	"errors"
	"fmt"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/telemetry"
	"slices"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/gpuaas/gpu-dra-driver/pkg/health"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/klog/v2"
)

// A GPU reset (nvidia-smi -r) and a driver upgrade (rmmod nvidia, what the
// GPU Operator's driver container does) both need every process to let go
// of the driver, and the plugin holds an NVML session and an event set for
// its whole life. Maintenance lets go of them while the plugin keeps
// running: released, it shuts NVML down, refuses new claims, taints its
// devices so that the scheduler places no claim on them, reports itself
// not ready, and still unprepares the claims whose teardown needs no NVML.
// Reacquired, it opens NVML again (waiting for the driver as at start),
// discovers the driver's files again and republishes; a driver of a new
// version takes a new process (nvdev.ErrNewProcessNeeded, Restart). The
// driver watch (driverwatch.go) does both on its own when the installed
// driver's version changes.

// KindMaintenance is the taint (gpu.gpuaas.io/maintenance=released,
// NoSchedule) on every device while the GPUs are released.
const KindMaintenance = "maintenance"

// Reasons of the Node events of maintenance.
const (
	ReasonGPUsReleased          = "GPUsReleased"
	ReasonGPUsReacquired        = "GPUsReacquired"
	ReasonDriverVersionChanged  = "DriverVersionChanged"
	ReasonReacquireFailed       = "ReacquireFailed"
	ReasonGPUsChangedWhileFreed = "GPUsChangedDuringMaintenance"
	ReasonRestartForDriver      = "RestartingForNewDriver"
)

// DriverFiles is what maintenance needs of the CDI handler: the driver
// files discovered again for a new session (cdi.Handler).
type DriverFiles interface {
	Refresh(lib nvml.Interface) (string, error)
	DriverVersion() string
}

// MaintenanceOptions let an operator take the GPUs from the running
// plugin, and the plugin follow driver upgrades. The zero value disables
// both (tests of other things).
type MaintenanceOptions struct {
	// Session is the plugin's NVML session, the one Options.NVML is.
	Session *nvdev.Releasable
	// Files are the driver files the CDI specs name.
	Files DriverFiles
	// Dir holds operators' requests and the plugin's answers
	// (RequestMaintenance, ReadMaintenanceStatus).
	Dir string
	// DriverRoot is where the installed driver's version is read.
	DriverRoot string
	// Interval is how often requests and the driver's version are looked
	// at, and how often a reacquire looks for the driver; zero is
	// nvdev.DriverRetryInterval.
	Interval time.Duration
	// RunHealth: the plugin runs Options.Health itself, and stops it while
	// the GPUs are released (its event set holds the driver too). False:
	// the caller runs it, and Session must not be released.
	RunHealth bool
	// Restart starts the plugin again in a new process, for a driver of
	// another version than the process loaded (nvdev.ErrNewProcessNeeded);
	// nil leaves the GPUs released.
	Restart func(reason error)
	// UpgradeState reads the node's GPU Operator driver-upgrade state
	// (WatchUpgradeState); nil: the plugin does not follow it.
	UpgradeState func() string
}

// maintenance is the Driver's part of it.
type maintenance struct {
	opts MaintenanceOptions
	// gate is held for reading by every prepare and unprepare, and for
	// writing while NVML is shut down or swapped, so that no call uses a
	// session as it goes.
	gate sync.RWMutex

	mu       sync.Mutex
	released bool
	since    time.Time
	reason   string
	// version is the installed driver the session was opened on ("" when
	// the driver root does not tell); the watch compares with it.
	version string
	// announced and failedFor are the installed versions last told of in
	// an event, and last failed to reacquire on: one event each, not one
	// per look.
	announced, failedFor string
	// forUpgrade: released because the GPU Operator's upgrade restarts
	// the driver (upgradestate.go), to be reacquired when it moves on.
	forUpgrade bool

	// stopHealth stops the running health monitor and waits for it.
	stopHealth func()
}

func newMaintenance(opts MaintenanceOptions) *maintenance {
	return &maintenance{opts: opts, since: time.Now(), version: nvdev.InstalledDriverVersion(opts.DriverRoot)}
}

// startMaintenance sets the maintenance state up at start, and runs the
// health monitor where it is the plugin's to run.
func (d *Driver) startMaintenance(ctx context.Context, opts Options, events telemetry.NodeEvents) {
	d.events, d.maint = events, newMaintenance(opts.Maintenance)
	d.maint.startHealth(ctx, opts.Health)
	d.metrics.SetMaintenance(d.maint.installedOr(opts.NVML.System().DriverVersion), false)
}

// hold keeps the GPUs from being released or reacquired until the
// returned func is called: a prepare or an unprepare uses NVML throughout.
func (m *maintenance) hold() func() {
	if m == nil {
		return func() {}
	}
	m.gate.RLock()
	return m.gate.RUnlock
}

// refusal is the error of a prepare while the GPUs are released.
func (m *maintenance) refusal() error {
	if m == nil {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.released {
		return nil
	}
	return fmt.Errorf("%w; released at %s: %s", nvdev.ErrReleased, m.since.UTC().Format(time.RFC3339), m.reason)
}

// isReleased reports whether the GPUs are released.
func (m *maintenance) isReleased() bool {
	if m == nil {
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.released
}

// NotReady is why the plugin is not ready though it runs (the GPUs are
// released for maintenance), nil when it is.
func (d *Driver) NotReady() error { return d.maint.refusal() }

// startHealth runs the health monitor until ctx ends or the GPUs are
// released.
func (m *maintenance) startHealth(ctx context.Context, monitor *health.Monitor) {
	if monitor == nil || !m.opts.RunHealth {
		return
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); monitor.Run(ctx) }()
	m.stopHealth = func() { cancel(); <-done }
}

// Release lets go of the GPUs: it waits for prepares and unprepares in
// flight, stops the health monitor, shuts NVML down, and republishes the
// devices tainted. Releasing again is a no-op.
func (d *Driver) Release(ctx context.Context, why string) error {
	m := d.maint
	if m == nil || m.opts.Session == nil {
		return errors.New("releasing the GPUs: the plugin was started without a releasable NVML session")
	}
	if !m.opts.RunHealth && d.health != nil {
		return errors.New("the health monitor is not the plugin's to stop: not releasing the GPUs")
	}
	m.gate.Lock()
	if m.isReleased() {
		m.gate.Unlock()
		return nil
	}
	if m.stopHealth != nil {
		m.stopHealth()
		m.stopHealth = nil
	}
	err := m.opts.Session.Release()
	m.mu.Lock()
	m.released, m.since, m.reason = true, time.Now(), why
	m.mu.Unlock()
	m.gate.Unlock()
	logger := klog.FromContext(ctx)
	if err != nil {
		// Not fatal: the session is not used again, and a reset or
		// unload tells the operator whether the driver is free.
		logger.Error(err, "Shutting down NVML for maintenance")
	}
	logger.Info("GPUs released for maintenance: NVML shut down, new claims refused, devices tainted", "reason", why)
	d.events.Normal(ReasonGPUsReleased, "Release", "GPUs released for maintenance (%s): NVML shut down, devices tainted %s%s, new claims refused until reacquired",
		why, health.TaintKeyPrefix, KindMaintenance)
	d.metrics.SetMaintenance(m.installedOr(m.opts.Session.System().DriverVersion), true)
	d.faultsChanged(ctx)
	return nil
}

// Reacquire takes the GPUs back: it opens NVML again (waiting for as long
// as ctx allows while the driver is not loaded), discovers the driver's
// files for the version it reports, checks the GPUs are those it
// published, and republishes them untainted. waiting is told why while it
// waits.
func (d *Driver) Reacquire(ctx context.Context, why string, waiting func(error)) error {
	m := d.maint
	if m == nil || m.opts.Session == nil {
		return errors.New("reacquiring the GPUs: the plugin was started without a releasable NVML session")
	}
	if !m.isReleased() {
		return nil
	}
	logger := klog.FromContext(ctx)
	before := m.opts.Session.GPUs()
	if err := m.opts.Session.Reacquire(ctx, m.opts.Interval, waiting); err != nil {
		if errors.Is(err, nvdev.ErrNewProcessNeeded) && m.opts.Restart != nil {
			// Released meanwhile: nothing is prepared with the old files.
			logger.Info("Starting the plugin again in a new process to load the new driver", "reason", why, "detail", err.Error())
			d.events.Normal(ReasonRestartForDriver, "Reacquire", "restarting the plugin to load the new driver (%s): %v", why, err)
			m.opts.Restart(err)
		}
		return err
	}
	version := m.opts.Session.System().DriverVersion
	if m.opts.Files != nil {
		// Before any claim is prepared: new containers get the files of
		// the driver loaded now.
		v, err := m.opts.Files.Refresh(m.opts.Session.NVML())
		if err != nil {
			logger.Error(err, "Discovering the driver's files after reacquiring the GPUs; CDI specs keep naming the previous driver's", "driverVersion", version)
			d.events.Warn(ReasonReacquireFailed, "Reacquire", "driver %s: its files were not found for CDI specs: %v", version, err)
		} else {
			logger.Info("Driver files discovered again for CDI specs", "driverVersion", v)
		}
	}
	if changed := gpusChanged(before, m.opts.Session.GPUs()); changed != "" {
		// The inventory is the start's: restarting the plugin publishes
		// what the node has now.
		logger.Error(nil, "The GPUs changed while released; restart the plugin pod to publish them", "change", changed)
		d.events.Warn(ReasonGPUsChangedWhileFreed, "Reacquire", "GPUs changed while released for maintenance (%s): restart the plugin pod on this node", changed)
	}
	m.gate.Lock()
	m.mu.Lock()
	m.released, m.reason, m.since, m.forUpgrade = false, "", time.Now(), false
	m.version = nvdev.InstalledDriverVersion(m.opts.DriverRoot)
	m.mu.Unlock()
	m.startHealth(ctx, d.health)
	m.gate.Unlock()
	logger.Info("GPUs reacquired", "reason", why, "driverVersion", version)
	d.events.Normal(ReasonGPUsReacquired, "Reacquire", "GPUs reacquired (%s), driver %s", why, version)
	d.metrics.SetMaintenance(m.installedOr(version), false)
	d.faultsChanged(ctx)
	return nil
}

// installedOr is the installed driver's version, or fallback when the
// driver root does not tell.
func (m *maintenance) installedOr(fallback string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.version != "" {
		return m.version
	}
	return fallback
}

// gpusChanged says how two enumerations differ by UUID, "" if not.
func gpusChanged(before, after []nvdev.GPU) string {
	uuids := func(gpus []nvdev.GPU) []string {
		out := make([]string, 0, len(gpus))
		for _, g := range gpus {
			out = append(out, g.UUID)
		}
		slices.Sort(out)
		return out
	}
	b, a := uuids(before), uuids(after)
	if slices.Equal(b, a) {
		return ""
	}
	return fmt.Sprintf("before %v, now %v", b, a)
}

// maintenanceFaults are the maintenance taints of every GPU while
// released.
func (d *Driver) maintenanceFaults() []health.Fault {
	m := d.maint
	if m == nil || m.opts.Session == nil {
		return nil
	}
	m.mu.Lock()
	released, since, reason := m.released, m.since, m.reason
	m.mu.Unlock()
	if !released {
		return nil
	}
	var out []health.Fault
	for _, gpu := range m.opts.Session.GPUs() {
		out = append(out, health.Fault{Kind: KindMaintenance, Value: "released", GPU: gpu.UUID, Since: since,
			Effect: resourceapi.DeviceTaintEffectNoSchedule, Message: "GPUs released for maintenance: " + reason})
	}
	return out
}

// faultsChanged republishes the devices with the current faults and wakes
// the kubelet's health streams, as a change of the monitor's faults does.
func (d *Driver) faultsChanged(ctx context.Context) {
	d.mu.Lock()
	if d.healthChanged != nil {
		close(d.healthChanged)
		d.healthChanged = make(chan struct{})
	}
	var err error
	if d.pub != nil {
		err = d.publishLocked(ctx)
	}
	d.mu.Unlock()
	if err != nil {
		klog.FromContext(ctx).Error(err, "Publishing devices after a maintenance change")
	}
	d.status.all(ctx)
}
