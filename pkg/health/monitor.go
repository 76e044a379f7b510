package health

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/gpuaas/gpu-dra-driver/pkg/mig"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/klog/v2"
)

// Defaults of Config.
const (
	DefaultProbeInterval = 5 * time.Second
	DefaultQuietPeriod   = 10 * time.Minute
	// waitTimeout bounds one NVML event wait, so that expiries and
	// shutdown are noticed without a second goroutine.
	waitTimeout = 500 * time.Millisecond
)

// noInstance is what NVML puts in an event's GPU/compute instance ID when
// the event is the whole GPU's.
const noInstance = 0xFFFFFFFF

// monitoredEvents are the NVML events that become faults.
const monitoredEvents = nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError

// Config tunes the monitor; the zero value uses the defaults.
type Config struct {
	// ProbeInterval is how often every GPU is asked whether it answers.
	ProbeInterval time.Duration
	// QuietPeriod is how long a transient XID keeps its taint after it was
	// last seen.
	QuietPeriod time.Duration
	// NoExecute lists fault kinds whose taints evict running pods; the
	// others only keep new claims away (NoSchedule).
	NoExecute []string
	// Now is the clock; nil is time.Now.
	Now func() time.Time
	// StatePath is where the faults are kept across plugin restarts within
	// BootID's boot; empty keeps them in memory only.
	StatePath string
	BootID    string
	// ClearDir holds operators' requests to clear a GPU's faults
	// (RequestClear); empty: none are read.
	ClearDir string
}

func (c Config) withDefaults() Config {
	if c.ProbeInterval <= 0 {
		c.ProbeInterval = DefaultProbeInterval
	}
	if c.QuietPeriod <= 0 {
		c.QuietPeriod = DefaultQuietPeriod
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// Monitor keeps the node's current faults.
type Monitor struct {
	lib     nvdev.Interface
	cfg     Config
	metrics *Metrics

	// watching is closed once every GPU is registered for events (or
	// known not to be), so that nothing is published before it; by the
	// first Run (the plugin runs the monitor again after the GPUs were
	// released for maintenance).
	watching     chan struct{}
	watchingOnce sync.Once

	// saveMu orders the saves of the faults (persist.go).
	saveMu sync.Mutex

	// reregister asks Run to register the GPUs for events again
	// (Reregister); one request pending at most.
	reregister chan struct{}

	mu       sync.Mutex
	faults   map[id]*Fault
	lost     map[string]bool // GPUs whose last probe failed
	onChange []func()
}

// New returns a monitor of lib's GPUs; Run starts it.
func New(lib nvdev.Interface, cfg Config, metrics *Metrics) *Monitor {
	return &Monitor{lib: lib, cfg: cfg.withDefaults(), metrics: metrics, faults: map[id]*Fault{}, lost: map[string]bool{},
		watching: make(chan struct{}), reregister: make(chan struct{}, 1)}
}

// Reregister asks the running monitor to register every GPU for events
// again, on a new event set, without waiting for it. A GPU the driver
// re-bound (a MIG mode change, mig-manager) may no longer deliver events
// to a registration made before: its XIDs would go unseen. Run also does
// it by itself when a probe finds a GPU's handle stale.
func (m *Monitor) Reregister() {
	select {
	case m.reregister <- struct{}{}:
	default: // one is pending already
	}
}

// OnChange registers f to be called (on the monitor's goroutine, without
// its lock) after the set of faults changed.
func (m *Monitor) OnChange(f func()) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.onChange = append(m.onChange, f)
}

// Faults returns the current faults, ordered by GPU and kind.
func (m *Monitor) Faults() []Fault {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]Fault, 0, len(m.faults))
	for _, f := range m.faults {
		out = append(out, *f)
	}
	slices.SortFunc(out, func(a, b Fault) int {
		if a.GPU != b.GPU {
			return strings.Compare(a.GPU, b.GPU)
		}
		return strings.Compare(a.Kind+a.Value, b.Kind+b.Value)
	})
	return out
}

// Watching is closed when Run has registered every GPU for events and
// probed each once: from then on no fault goes unseen.
func (m *Monitor) Watching() <-chan struct{} { return m.watching }

// Run watches the GPUs until ctx ends: NVML events as they come, a probe
// of every GPU each ProbeInterval, and expiry of transient faults. Its
// event set is freed when it returns, and it may be run again after.
func (m *Monitor) Run(ctx context.Context) {
	logger := klog.FromContext(ctx).WithName("health")
	ctx = klog.NewContext(ctx, logger)
	m.load(ctx)
	m.metrics.setFaults(m.Faults())
	m.takeReregister() // a request made before this Run: it registers now
	set := m.register(ctx)
	defer func() { freeSet(set) }()
	m.probe(ctx)
	m.watchingOnce.Do(func() { close(m.watching) })
	// Probes are paced by the real clock; Now only dates and expires faults.
	nextProbe := time.Now().Add(m.cfg.ProbeInterval)
	for ctx.Err() == nil {
		if set != nil {
			m.wait(ctx, set)
		} else {
			sleep(ctx, waitTimeout)
		}
		if !time.Now().Before(nextProbe) {
			m.applyClears(ctx)
			m.probe(ctx)
			nextProbe = time.Now().Add(m.cfg.ProbeInterval)
		}
		if m.takeReregister() {
			klog.FromContext(ctx).Info("Registering the GPUs for events again")
			freeSet(set)
			set = m.register(ctx)
		}
		m.expire(ctx)
	}
}

// takeReregister takes a pending Reregister request, if there is one.
func (m *Monitor) takeReregister() bool {
	select {
	case <-m.reregister:
		return true
	default:
		return false
	}
}

func freeSet(set nvml.EventSet) {
	if set != nil {
		_ = set.Free()
	}
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// register creates the event set and registers every GPU on it. A GPU
// that cannot deliver XID events gets an informational fault, so that an
// operator sees which GPUs are watched by the probe alone.
func (m *Monitor) register(ctx context.Context) nvml.EventSet {
	logger := klog.FromContext(ctx)
	set, ret := m.lib.NVML().EventSetCreate()
	if ret != nvml.SUCCESS {
		logger.Error(fmt.Errorf("%v", nvml.ErrorString(ret)), "NVML events unavailable; GPUs are probed only")
		set = nil
	}
	for _, gpu := range m.lib.GPUs() {
		err := m.registerGPU(gpu.UUID, set)
		if err == nil {
			// Watched now, if a registration before was refused.
			m.clear(ctx, func(f *Fault) bool { return f.GPU == gpu.UUID && f.Kind == KindUnmonitored })
			continue
		}
		logger.Info("GPU not watched for XIDs", "gpu", gpu.UUID, "err", err)
		m.add(ctx, Fault{Kind: KindUnmonitored, Value: "no-xid-events", GPU: gpu.UUID, Message: err.Error(),
			Effect: resourceapi.DeviceTaintEffectNone})
	}
	return set
}

// registerGPU registers a GPU on set, on a handle asked for again if the
// cached one is stale (nvdev.WithHandle).
func (m *Monitor) registerGPU(uuid string, set nvml.EventSet) error {
	if set == nil {
		return fmt.Errorf("no NVML event set")
	}
	_, err := nvdev.WithHandle(m.lib, uuid, func(dev nvml.Device) error {
		supported, ret := dev.GetSupportedEventTypes()
		if ret != nvml.SUCCESS {
			return fmt.Errorf("supported event types: %w", ret)
		}
		if supported&nvml.EventTypeXidCriticalError == 0 {
			return fmt.Errorf("XID events not supported")
		}
		if ret := dev.RegisterEvents(monitoredEvents&supported, set); ret != nvml.SUCCESS {
			return fmt.Errorf("registering for events: %w", ret)
		}
		return nil
	})
	return err
}

// wait takes the events NVML has (or times out) and records them.
func (m *Monitor) wait(ctx context.Context, set nvml.EventSet) {
	data, ret := set.Wait(uint32(waitTimeout / time.Millisecond))
	switch ret {
	case nvml.SUCCESS:
		m.event(ctx, data)
	case nvml.ERROR_TIMEOUT:
	default:
		// A GPU that fell off the bus can make Wait fail; the probe will
		// tell which. Do not spin.
		klog.FromContext(ctx).V(2).Info("NVML event wait failed", "err", nvml.ErrorString(ret))
		sleep(ctx, waitTimeout)
	}
}

// event turns one NVML event into a fault.
func (m *Monitor) event(ctx context.Context, data nvml.EventData) {
	logger := klog.FromContext(ctx)
	uuid, ret := data.Device.GetUUID()
	if ret != nvml.SUCCESS {
		logger.Error(fmt.Errorf("%v", nvml.ErrorString(ret)), "Event of a GPU that does not tell its UUID", "type", data.EventType)
		return
	}
	scope := m.migScope(data)
	now := m.cfg.Now()
	switch {
	case data.EventType&nvml.EventTypeXidCriticalError != 0:
		class := ClassifyXID(data.EventData)
		m.metrics.xid(uuid, data.EventData, class)
		logger.Info("XID", "gpu", uuid, "xid", data.EventData, "class", class, "gpuInstance", data.GpuInstanceId)
		if class == XIDApplication {
			return
		}
		f := Fault{Kind: KindXID, Value: fmt.Sprint(data.EventData), GPU: uuid, MIG: scope, Since: now,
			Message: fmt.Sprintf("XID %d (%s)", data.EventData, class)}
		if class == XIDTransient {
			f.Until = now.Add(m.cfg.QuietPeriod)
		}
		m.add(ctx, f)
	case data.EventType&nvml.EventTypeDoubleBitEccError != 0:
		m.add(ctx, Fault{Kind: KindECC, Value: "double-bit", GPU: uuid, MIG: scope, Since: now,
			Message: "double-bit ECC error: memory contents are lost until the GPU is reset"})
	}
}

// migScope finds the MIG device an event names, by its GPU instance's
// placement. An instance that is already gone leaves the fault on the
// whole GPU: better a wider taint than none.
func (m *Monitor) migScope(data nvml.EventData) *MIGScope {
	if data.GpuInstanceId == noInstance {
		return nil
	}
	gi, ret := data.Device.GetGpuInstanceById(int(data.GpuInstanceId))
	if ret != nvml.SUCCESS {
		return nil
	}
	info, ret := gi.GetInfo()
	if ret != nvml.SUCCESS {
		return nil
	}
	index, ok := giProfileIndex(data.Device, info.ProfileId)
	if !ok {
		return nil
	}
	return &MIGScope{GIProfileID: index, GIID: int(info.Id),
		Placement: mig.Placement{Start: int(info.Placement.Start), Size: int(info.Placement.Size)}}
}

// giProfileIndex turns the profile ID NVML reports for a GPU instance
// into the profile index (nvml.GPU_INSTANCE_PROFILE_*) the device model
// names profiles by; the two differ.
func giProfileIndex(dev nvml.Device, profileID uint32) (int, bool) {
	for i := range nvml.GPU_INSTANCE_PROFILE_COUNT {
		info, ret := dev.GetGpuInstanceProfileInfo(i)
		if ret == nvml.SUCCESS && info.Id == profileID {
			return i, true
		}
	}
	return 0, false
}

// probe asks every GPU whether it answers. A GPU that stops answering is
// lost; one that answers again has been reset (or re-attached), which
// clears what only a reset clears.
func (m *Monitor) probe(ctx context.Context) {
	for _, gpu := range m.lib.GPUs() {
		err := m.answers(ctx, gpu.UUID)
		m.mu.Lock()
		wasLost := m.lost[gpu.UUID]
		m.lost[gpu.UUID] = err != nil
		m.mu.Unlock()
		switch {
		case err != nil && !wasLost:
			klog.FromContext(ctx).Info("GPU does not answer", "gpu", gpu.UUID, "err", err)
			m.add(ctx, Fault{Kind: KindGPULost, Value: "not-answering", GPU: gpu.UUID, Since: m.cfg.Now(), Message: err.Error()})
		case err == nil && wasLost:
			klog.FromContext(ctx).Info("GPU answers again; clearing the faults a reset clears", "gpu", gpu.UUID)
			m.clear(ctx, func(f *Fault) bool {
				return f.GPU == gpu.UUID && f.Kind != KindCleanupBlocked && f.Kind != KindUnmonitored
			})
		}
		if err == nil {
			m.probeRowRemap(ctx, gpu.UUID)
		}
	}
}

// probeRowRemap turns a pending or failed row remapping (no event reports
// it) into a fault, cleared once the GPU no longer reports it: a reset
// applies a pending remapping. GPUs without row remapping (before Ampere)
// answer NOT_SUPPORTED and are left alone.
func (m *Monitor) probeRowRemap(ctx context.Context, uuid string) {
	var pending, failed bool
	_, err := nvdev.WithHandle(m.lib, uuid, func(dev nvml.Device) error {
		var ret nvml.Return
		_, _, pending, failed, ret = dev.GetRemappedRows()
		return nvdev.Returned(ret)
	})
	if err != nil {
		return
	}
	switch {
	case failed:
		m.add(ctx, Fault{Kind: KindRowRemap, Value: "failed", GPU: uuid, Since: m.cfg.Now(),
			Message: "a row remapping failed: the GPU's memory has an uncorrectable error that cannot be remapped"})
	case pending:
		m.add(ctx, Fault{Kind: KindRowRemap, Value: "pending", GPU: uuid, Since: m.cfg.Now(),
			Message: "a row remapping is pending: reset the GPU to apply it"})
	default:
		m.clear(ctx, func(f *Fault) bool { return f.GPU == uuid && f.Kind == KindRowRemap })
	}
}

// answers makes a cheap NVML call that needs the GPU itself. A GPU whose
// cached handle is stale but that answers on one asked for again was
// re-bound, not lost: it answers, and its event registration, made with
// the stale handle, is made again.
func (m *Monitor) answers(ctx context.Context, uuid string) error {
	renewed, err := nvdev.WithHandle(m.lib, uuid, func(dev nvml.Device) error {
		if _, ret := dev.GetMemoryInfo(); ret != nvml.SUCCESS && ret != nvml.ERROR_NOT_SUPPORTED {
			return fmt.Errorf("memory info: %w", ret)
		}
		return nil
	})
	if renewed {
		klog.FromContext(ctx).Info("GPU answers on a new handle (re-bound?); registering for its events again", "gpu", uuid)
		m.Reregister()
	}
	return err
}

// SetMissing reports GPUs the node is known to have (by UUID, with what
// is known of why) that the NVML session could not read, so could not
// watch: each is lost (gpu-lost=not-answering) until a later session reads
// it again, whose first probe then clears the fault as it clears any
// saved gpu-lost fault of a GPU that answers. Safe while Run runs.
func (m *Monitor) SetMissing(ctx context.Context, gpus map[string]string) {
	uuids := slices.Sorted(maps.Keys(gpus))
	for _, uuid := range uuids {
		m.mu.Lock()
		m.lost[uuid] = true
		m.mu.Unlock()
		m.add(ctx, Fault{Kind: KindGPULost, Value: "not-answering", GPU: uuid, Since: m.cfg.Now(),
			Message: "not enumerated, so not published: " + gpus[uuid]})
	}
}

// expire clears transient faults whose quiet period has passed.
func (m *Monitor) expire(ctx context.Context) {
	now := m.cfg.Now()
	m.clear(ctx, func(f *Fault) bool { return !f.Until.IsZero() && !now.Before(f.Until) })
}

// SetCleanupBlocked records that tearing down a device failed (err != nil)
// or has now succeeded (err == nil). The plugin calls it from unprepare;
// the device stays tainted until a retry succeeds.
func (m *Monitor) SetCleanupBlocked(ctx context.Context, gpu string, scope *MIGScope, err error) {
	if err == nil {
		m.clear(ctx, func(f *Fault) bool {
			return f.Kind == KindCleanupBlocked && f.GPU == gpu && sameScope(f.MIG, scope)
		})
		return
	}
	m.add(ctx, Fault{Kind: KindCleanupBlocked, Value: "mig-destroy", GPU: gpu, MIG: scope, Since: m.cfg.Now(), Message: err.Error()})
}

func sameScope(a, b *MIGScope) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.GIProfileID == b.GIProfileID && a.Placement == b.Placement
}

// add records f, or renews the same fault (keeping its Since).
func (m *Monitor) add(ctx context.Context, f Fault) {
	if f.Effect == "" {
		f.Effect = m.effect(f.Kind)
	}
	m.saveMu.Lock()
	defer m.saveMu.Unlock()
	m.mu.Lock()
	old, ok := m.faults[f.id()]
	if ok {
		f.Since = old.Since
	}
	m.faults[f.id()] = &f
	changed := !ok || old.Effect != f.Effect
	callbacks := slices.Clone(m.onChange)
	m.mu.Unlock()
	if !changed {
		return
	}
	klog.FromContext(ctx).Info("Device fault", "fault", f.String(), "effect", f.Effect, "until", f.Until)
	m.save(ctx)
	m.metrics.setFaults(m.Faults())
	for _, cb := range callbacks {
		cb()
	}
}

// clear removes the faults drop selects.
func (m *Monitor) clear(ctx context.Context, drop func(*Fault) bool) {
	m.saveMu.Lock()
	defer m.saveMu.Unlock()
	m.mu.Lock()
	var cleared []string
	for k, f := range m.faults {
		if drop(f) {
			cleared = append(cleared, f.String())
			delete(m.faults, k)
		}
	}
	callbacks := slices.Clone(m.onChange)
	m.mu.Unlock()
	if len(cleared) == 0 {
		return
	}
	klog.FromContext(ctx).Info("Device faults cleared", "faults", cleared)
	m.save(ctx)
	m.metrics.setFaults(m.Faults())
	for _, cb := range callbacks {
		cb()
	}
}

func (m *Monitor) effect(kind string) resourceapi.DeviceTaintEffect {
	if kind == KindUnmonitored {
		return resourceapi.DeviceTaintEffectNone
	}
	if slices.Contains(m.cfg.NoExecute, kind) {
		return resourceapi.DeviceTaintEffectNoExecute
	}
	return resourceapi.DeviceTaintEffectNoSchedule
}
