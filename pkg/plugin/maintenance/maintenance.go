// Package maintenance takes the node's GPUs out of service and back while
// the plugin runs: releasing them (NVML shut down, new claims refused,
// devices tainted) and reacquiring them, at an operator's request (files
// in the plugin's data directory), when the installed driver's version
// changes, and while the GPU Operator's upgrade restarts the driver. It
// knows nothing of the kubelet: the plugin wires it (Host) and asks it
// (Hold for each claim, Refusal, Faults).
package maintenance

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/gpuaas/gpu-dra-driver/pkg/health"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/telemetry"
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

// Options let an operator take the GPUs from the running plugin, and the
// plugin follow driver upgrades. The zero value disables both (tests of
// other things).
type Options struct {
	// Session is the plugin's NVML session, the one Options.NVML is.
	Session *nvdev.Releasable
	// Files are the driver files the CDI specs name.
	Files DriverFiles
	// Dir holds operators' requests and the plugin's answers (Request,
	// ReadStatus).
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
	// ReleaseWait bounds how long a release waits for the prepares and
	// unprepares in flight; zero is DefaultReleaseWait.
	ReleaseWait time.Duration
}

// Host is what maintenance uses of the kubelet plugin that runs it.
type Host struct {
	// Health is the plugin's health monitor; nil: none. Where
	// Options.RunHealth says so, maintenance runs it, and stops it while
	// the GPUs are released.
	Health  *health.Monitor
	Events  telemetry.NodeEvents
	Metrics *telemetry.Metrics
	// FaultsChanged republishes the devices with the current faults
	// (Faults among them) and wakes the kubelet's health streams, as a
	// change of the monitor's faults does.
	FaultsChanged func(ctx context.Context)
}

// Maintenance is the GPUs released for maintenance, or not. A nil
// *Maintenance (a plugin started without it) never releases them.
type Maintenance struct {
	opts Options
	host Host
	// gate is held for reading by the prepare or unprepare of each claim
	// (Hold), and for writing while NVML is shut down or swapped, so that
	// no call uses a session as it goes.
	gate sync.RWMutex

	mu       sync.Mutex
	released bool
	since    time.Time
	reason   string
	// releasing is the release waiting for the gate, zero when none: new
	// holds are refused meanwhile (Hold). Releases come one at a time,
	// from the watch.
	releasing asked
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

// New sets the maintenance state up at start: the GPUs in service.
func New(opts Options, host Host) *Maintenance {
	return &Maintenance{opts: opts, host: host, since: time.Now(), version: nvdev.InstalledDriverVersion(opts.DriverRoot)}
}

// Start runs the health monitor where it is the plugin's to run, and
// reports the driver's version (the installed one, else loaded()).
func (m *Maintenance) Start(ctx context.Context, loaded func() string) {
	m.startHealth(ctx)
	m.host.Metrics.SetMaintenance(m.installedOr(loaded()), false)
}

// asked is a release asked for: when, and why.
type asked struct {
	at  time.Time
	why string
}

// ErrReleasing refuses a claim's prepare or unprepare that would start
// while a release waits for the calls in flight; the kubelet retries it.
var ErrReleasing = errors.New("GPUs being released for maintenance")

// Hold keeps the GPUs from being released or reacquired until the
// returned func is called: the prepare or unprepare of one claim uses NVML
// throughout. It is taken per claim, not per kubelet call, so that a
// release waits for the claim in progress only, and the claims after it
// are refused (ErrReleasing) instead of running on a node asked to let go
// of its GPUs. Behind a reacquire, which waits for the claims in flight
// and then swaps the session, a hold waits, but no longer than ctx.
func (m *Maintenance) Hold(ctx context.Context) (func(), error) {
	if m == nil {
		return func() {}, nil
	}
	if err := m.rlockGate(ctx); err != nil {
		return nil, err
	}
	if err := m.releasingRefusal(); err != nil {
		m.gate.RUnlock()
		return nil, err
	}
	return m.gate.RUnlock, nil
}

// rlockGate takes the gate for reading within ctx. It tries instead of
// waiting in RLock, which takes no context: a reacquire waiting for the
// claims in flight holds every new reader back.
func (m *Maintenance) rlockGate(ctx context.Context) error {
	for !m.gate.TryRLock() {
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for the GPUs' reacquire or release to end: %w", context.Cause(ctx))
		case <-time.After(gatePoll):
		}
	}
	return nil
}

// releasingRefusal is ErrReleasing while a release waits for the gate,
// nil otherwise.
func (m *Maintenance) releasingRefusal() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.releasing.at.IsZero() {
		return nil
	}
	return fmt.Errorf("%w (asked at %s: %s); retry once they are released or the release failed",
		ErrReleasing, m.releasing.at.UTC().Format(time.RFC3339), m.releasing.why)
}

// setReleasing marks a release as waiting for the gate (or none: zero).
func (m *Maintenance) setReleasing(a asked) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.releasing = a
}

// Refusal is the error of a prepare while the GPUs are released, nil
// while they are in service.
func (m *Maintenance) Refusal() error {
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

// Released reports whether the GPUs are released.
func (m *Maintenance) Released() bool {
	if m == nil {
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.released
}

// startHealth runs the health monitor until ctx ends or the GPUs are
// released.
func (m *Maintenance) startHealth(ctx context.Context) {
	monitor := m.host.Health
	if monitor == nil || !m.opts.RunHealth {
		return
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); monitor.Run(ctx) }()
	m.stopHealth = func() { cancel(); <-done }
}

// Release lets go of the GPUs: it waits for the claims being prepared or
// unprepared, refusing new ones meanwhile, stops the health monitor, shuts
// NVML down, and republishes the devices tainted. Releasing again is a
// no-op.
func (m *Maintenance) Release(ctx context.Context, why string) error {
	if m == nil || m.opts.Session == nil {
		return errors.New("releasing the GPUs: the plugin was started without a releasable NVML session")
	}
	if !m.opts.RunHealth && m.host.Health != nil {
		return errors.New("the health monitor is not the plugin's to stop: not releasing the GPUs")
	}
	if err := m.lockGate(ctx, why); err != nil {
		return err
	}
	if m.Released() {
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
	m.host.Events.Normal(ReasonGPUsReleased, "Release", "GPUs released for maintenance (%s): NVML shut down, devices tainted %s%s, new claims refused until reacquired",
		why, health.TaintKeyPrefix, KindMaintenance)
	m.host.Metrics.SetMaintenance(m.installedOr(m.opts.Session.System().DriverVersion), true)
	m.host.FaultsChanged(ctx)
	return nil
}

// DefaultReleaseWait bounds a release's wait for the calls in flight.
const DefaultReleaseWait = 30 * time.Second

// gatePoll is how often a release tries the gate again while claims hold
// it, and a hold while a reacquire waits for it or holds it.
const gatePoll = 10 * time.Millisecond

// lockGate takes the gate for writing once the claims in flight are done,
// within ctx and the release's bound. It tries instead of waiting in
// Lock: a writer waiting in Lock holds every new reader back, so one hung
// prepare would freeze every kubelet call on the node behind the release.
// New holds are refused meanwhile (releasingRefusal), so the claims in
// flight are all it waits for. Past the bound the release fails and the
// GPUs stay in service.
func (m *Maintenance) lockGate(ctx context.Context, why string) error {
	wait := cmp.Or(m.opts.ReleaseWait, DefaultReleaseWait)
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	m.setReleasing(asked{at: time.Now(), why: why})
	// Taken, the gate keeps every hold out until Release is done.
	defer m.setReleasing(asked{})
	for !m.gate.TryLock() {
		select {
		case <-ctx.Done():
			return fmt.Errorf("not released: prepares or unprepares still in flight after %s (%w); the GPUs stay in service", wait, ctx.Err())
		case <-time.After(gatePoll):
		}
	}
	return nil
}

// Reacquire takes the GPUs back: it opens NVML again (waiting for as long
// as ctx allows while the driver is not loaded), discovers the driver's
// files for the version it reports, checks the GPUs are those it
// published, and republishes them untainted. waiting is told why while it
// waits.
func (m *Maintenance) Reacquire(ctx context.Context, why string, waiting func(error)) error {
	if m == nil || m.opts.Session == nil {
		return errors.New("reacquiring the GPUs: the plugin was started without a releasable NVML session")
	}
	if !m.Released() {
		return nil
	}
	logger := klog.FromContext(ctx)
	before := m.opts.Session.GPUs()
	if err := m.opts.Session.Reacquire(ctx, m.opts.Interval, waiting); err != nil {
		if errors.Is(err, nvdev.ErrNewProcessNeeded) && m.opts.Restart != nil {
			// Released meanwhile: nothing is prepared with the old files.
			logger.Info("Starting the plugin again in a new process to load the new driver", "reason", why, "detail", err.Error())
			m.host.Events.Normal(ReasonRestartForDriver, "Reacquire", "restarting the plugin to load the new driver (%s): %v", why, err)
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
			m.host.Events.Warn(ReasonReacquireFailed, "Reacquire", "driver %s: its files were not found for CDI specs: %v", version, err)
		} else {
			logger.Info("Driver files discovered again for CDI specs", "driverVersion", v)
		}
	}
	if changed := gpusChanged(before, m.opts.Session.GPUs()); changed != "" {
		// The inventory is the start's: restarting the plugin publishes
		// what the node has now.
		logger.Error(nil, "The GPUs changed while released; restart the plugin pod to publish them", "change", changed)
		m.host.Events.Warn(ReasonGPUsChangedWhileFreed, "Reacquire", "GPUs changed while released for maintenance (%s): restart the plugin pod on this node", changed)
	}
	m.gate.Lock()
	m.mu.Lock()
	m.released, m.reason, m.since, m.forUpgrade = false, "", time.Now(), false
	m.version = nvdev.InstalledDriverVersion(m.opts.DriverRoot)
	m.mu.Unlock()
	m.startHealth(ctx)
	m.gate.Unlock()
	logger.Info("GPUs reacquired", "reason", why, "driverVersion", version)
	m.host.Events.Normal(ReasonGPUsReacquired, "Reacquire", "GPUs reacquired (%s), driver %s", why, version)
	m.host.Metrics.SetMaintenance(m.installedOr(version), false)
	m.host.FaultsChanged(ctx)
	return nil
}

// installedOr is the installed driver's version, or fallback when the
// driver root does not tell.
func (m *Maintenance) installedOr(fallback string) string {
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

// Faults are the maintenance taints of every GPU while released.
func (m *Maintenance) Faults() []health.Fault {
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

// HealthRunning reports whether maintenance runs the health monitor now
// (never while the GPUs are released).
func (m *Maintenance) HealthRunning() bool { return m.stopHealth != nil }

// StopHealth stops the health monitor maintenance runs, if it does, and
// waits for it.
func (m *Maintenance) StopHealth() {
	if m.stopHealth != nil {
		m.stopHealth()
	}
}
