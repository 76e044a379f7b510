// Package usage measures what the claims prepared on this node use of their
// devices, not only what they hold: the SM utilization and memory used of
// each prepared device, split by claim and by pod on a shared GPU, judged
// in windows against the claim's idle threshold. It exports the use as
// metrics, tells the device status writer when a device's Idle condition
// changes, and renews the Lease that says its samples are fresh
// (docs/usage.md, "Measuring use").
package usage

import (
	"context"
	"maps"
	"strings"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/checkpoint"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/device"
)

// Defaults of the plugin's flags.
const (
	DefaultInterval = 10 * time.Second
	DefaultWindow   = 30 * time.Second
	DefaultProcRoot = "/proc"
)

// Thresholds resolves a claim's idle threshold (percent of SM
// utilization) from its namespace and its device's DeviceClass.
type Thresholds interface {
	Threshold(namespace, deviceClass string) int32
}

// Tenants names a namespace's tenant (its TenantQuota), "" for none: the
// tenant label of the use metrics.
type Tenants interface {
	Tenant(namespace string) string
}

// Options configure a Sampler.
type Options struct {
	NVML nvdev.Interface
	// ProcRoot is where /proc/<pid>/cgroup is read (the host's /proc).
	ProcRoot string
	// Interval between samples, Window the length of a judged window.
	Interval, Window time.Duration
	// Thresholds; nil: 0 for every claim.
	Thresholds Thresholds
	// Tenants; nil: every claim's tenant is "".
	Tenants Tenants
	Metrics *Metrics
	// Devices are the published devices by name, for the existing MIG
	// device a static-MIG device stands for; nil: none.
	Devices func() map[string]*device.AllocatableDevice
	// Changed is told the claim whose Idle condition changed on a device;
	// nil: nobody.
	Changed func(types.UID)
}

// kind is how a device's use is measured.
type kind int

const (
	// wholeGPU: the GPU's own utilization and memory.
	wholeGPU kind = iota
	// migDevice: GPM SM activity of the GPU instance, its memory.
	migDevice
	// sharedGPU: several claims on one GPU (time-slice replicas, memory
	// shares, MPS clients): per-process samples mapped to pods.
	sharedGPU
)

// deviceKey names a prepared device of a claim.
type deviceKey struct {
	claim   types.UID
	device  string
	shareID string
}

// tracked is a prepared claim.
type tracked struct {
	uid             types.UID
	namespace, name string
	// pods are the pods the claim is reserved for, UID to name; replaced,
	// never changed in place, so that a pass reads its snapshot unlocked.
	pods    map[types.UID]string
	devices []*trackedDevice
}

// trackedDevice is a prepared device of a claim and its judge.
type trackedDevice struct {
	key      deviceKey
	claim    *tracked
	gpu      string
	profile  string
	kind     kind
	migUUID  string
	giID     int
	share    float64
	judge    *judge
	prevPods map[string]bool // pod label values exported last pass
	// tenant is the tenant label exported last pass.
	tenant string
	// pods are the claim's pods as of this pass's snapshot; only the
	// sampling goroutine touches them.
	pods map[types.UID]string
}

// Sampler samples the prepared devices' use. Tracking, forgetting and
// reading conditions never wait for a sampling pass: a pass measures a
// snapshot of the devices without the lock and applies what it measured
// under it.
type Sampler struct {
	opts  Options
	procs *procPods

	mu     sync.Mutex
	claims map[types.UID]*tracked

	// Only the sampling goroutine touches what follows.
	gpus map[string]*gpuState
	gpm  map[deviceKey]*gpmState
	// metricsGet is GpmMetricsGet's argument, large (477 metrics), reused.
	metricsGet *nvml.GpmMetricsGetType
}

// gpuState is what a GPU's sampling keeps between passes.
type gpuState struct {
	// lastSeen is the newest process sample seen, NVML's timestamp (µs).
	lastSeen uint64
	// gpm: GpmQueryDeviceSupport answered (once), and what.
	gpmAsked, gpmSupported bool
}

// gpmState is a MIG device's GPM samples: the previous and the current.
type gpmState struct {
	prev, cur nvml.GpmSample
	have      bool // prev holds a sample
}

// New makes a Sampler; Track adds the claims.
func New(opts Options) *Sampler {
	if opts.Interval <= 0 {
		opts.Interval = DefaultInterval
	}
	if opts.Window <= 0 {
		opts.Window = DefaultWindow
	}
	if opts.ProcRoot == "" {
		opts.ProcRoot = DefaultProcRoot
	}
	return &Sampler{opts: opts, procs: newProcPods(opts.ProcRoot), claims: map[types.UID]*tracked{},
		gpus: map[string]*gpuState{}, gpm: map[deviceKey]*gpmState{}}
}

// Interval is the time between samples.
func (s *Sampler) Interval() time.Duration { return s.opts.Interval }

// Track adds a prepared claim from its record, at now, or refreshes its
// pods. A device it already tracks keeps its judge; a new one starts
// Unknown/NoSamples, as every device does after a restart.
func (s *Sampler) Track(rec *checkpoint.Claim, now time.Time) {
	if s == nil || rec == nil || rec.State != checkpoint.PrepareCompleted {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	uid := types.UID(rec.UID)
	c := s.claims[uid]
	if c == nil {
		c = &tracked{uid: uid, namespace: rec.Namespace, name: rec.Name, pods: map[types.UID]string{}}
		for i := range rec.Devices {
			if d := s.newDevice(c, &rec.Devices[i], now); d != nil {
				c.devices = append(c.devices, d)
			}
		}
		s.claims[uid] = c
	}
	c.pods = withPods(c.pods, rec.Pods)
}

// withPods is pods and more, a new map.
func withPods(pods map[types.UID]string, more []checkpoint.Pod) map[types.UID]string {
	out := maps.Clone(pods)
	if out == nil {
		out = make(map[types.UID]string, len(more))
	}
	for _, p := range more {
		out[types.UID(p.UID)] = p.Name
	}
	return out
}

// Tracks reports whether the claim is tracked.
func (s *Sampler) Tracks(uid types.UID) bool {
	if s == nil {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.claims[uid] != nil
}

// SetPods adds the pods a claim is reserved for (each prepare of the
// claim passes them: a claim shared by pods is prepared once for each).
func (s *Sampler) SetPods(uid types.UID, pods []checkpoint.Pod) {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if c := s.claims[uid]; c != nil {
		c.pods = withPods(c.pods, pods)
	}
}

// Forget drops an unprepared claim and its metric series.
func (s *Sampler) Forget(uid types.UID) {
	if s == nil {
		return
	}
	s.mu.Lock()
	c := s.claims[uid]
	delete(s.claims, uid)
	s.mu.Unlock()
	if c != nil {
		s.opts.Metrics.forget(c.namespace, c.name)
	}
}

// Condition is the Idle condition of a claim's device; false for a device
// not measured (not tracked, or held for monitoring: admin access).
func (s *Sampler) Condition(uid types.UID, deviceName, shareID string) (Condition, bool) {
	if s == nil {
		return Condition{}, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.claims[uid]
	if c == nil {
		return Condition{}, false
	}
	for _, d := range c.devices {
		if d.key.device == deviceName && d.key.shareID == shareID {
			return d.judge.cond, true
		}
	}
	return Condition{}, false
}

// newDevice is how a recorded device is measured; nil for one that is not:
// a device with admin access is held for monitoring, and its GPU's use is
// not the claim's.
func (s *Sampler) newDevice(c *tracked, d *checkpoint.Device, now time.Time) *trackedDevice {
	if d.AdminAccess {
		return nil
	}
	td := &trackedDevice{key: deviceKey{claim: c.uid, device: d.Device, shareID: d.ShareID}, claim: c,
		gpu: d.GPUUUID, profile: d.DeviceClass, share: d.GPUShare, judge: newJudge(now, s.opts.Window)}
	if td.share <= 0 {
		td.share = 1
	}
	mode, _, _ := strings.Cut(d.GPUMode, "/")
	switch {
	case d.CreatedMIG != nil:
		td.kind, td.migUUID, td.giID = migDevice, d.CreatedMIG.UUID, d.CreatedMIG.GIID
	case mode == string(configapi.MigStatic):
		td.kind = migDevice
		if s.opts.Devices != nil {
			if dev := s.opts.Devices()[d.Device]; dev != nil && dev.StaticInstance() != nil {
				td.migUUID, td.giID = dev.StaticInstance().UUID, dev.StaticInstance().GIID
			}
		}
	case d.Shared || mode == "timeSlicing" || mode == "shared":
		td.kind = sharedGPU
	}
	return td
}

// Run samples every interval until ctx ends.
func (s *Sampler) Run(ctx context.Context) {
	wait.UntilWithContext(ctx, func(ctx context.Context) { s.Sample(ctx, time.Now()) }, s.opts.Interval)
}

// measured is what one pass measured of one device.
type measured struct {
	d   *trackedDevice
	use sample
	// memory used, bytes; memKnown false where NVML could not tell.
	memory   uint64
	memKnown bool
	// byPod is the use split by pod (label value, the pod's name) on a
	// shared GPU; nil elsewhere.
	byPod map[string]podUse
}

type podUse struct {
	util   float64
	memory uint64
}

// Sample makes one sampling pass at now: measures every tracked device,
// judges the samples and exports them.
func (s *Sampler) Sample(ctx context.Context, now time.Time) {
	devices := s.snapshot()
	results := make([]measured, 0, len(devices))
	byGPU := map[string][]*trackedDevice{}
	for _, d := range devices {
		byGPU[d.gpu] = append(byGPU[d.gpu], d)
	}
	for gpu, ds := range byGPU {
		results = s.measureGPUGuarded(ctx, gpu, ds, results)
	}
	s.procs.endPass()
	s.dropGPM(devices)
	s.apply(now, results)
}

// snapshot lists the tracked devices.
func (s *Sampler) snapshot() []*trackedDevice {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*trackedDevice
	for _, c := range s.claims {
		for _, d := range c.devices {
			d.pods = c.pods
		}
		out = append(out, c.devices...)
	}
	return out
}

// apply judges the pass's samples and exports them, and tells Changed of
// the claims whose condition changed.
func (s *Sampler) apply(now time.Time, results []measured) {
	var changed []types.UID
	s.mu.Lock()
	for i := range results {
		m := &results[i]
		c := m.d.claim
		if s.claims[c.uid] != c {
			continue // forgotten meanwhile
		}
		threshold := int32(0)
		if s.opts.Thresholds != nil {
			threshold = s.opts.Thresholds.Threshold(c.namespace, m.d.profile)
		}
		ch, idle := m.d.judge.add(now, m.use, threshold)
		if ch {
			changed = append(changed, c.uid)
		}
		tenant := ""
		if s.opts.Tenants != nil {
			tenant = s.opts.Tenants.Tenant(c.namespace)
		}
		s.opts.Metrics.export(m, tenant, soloPod(c), idle)
	}
	s.mu.Unlock()
	if s.opts.Changed != nil {
		for _, uid := range changed {
			s.opts.Changed(uid)
		}
	}
}

// soloPod is the pod label of a claim's series: its pod's name if it has
// exactly one, else "" (one claim spanning pods).
func soloPod(c *tracked) string {
	if len(c.pods) != 1 {
		return ""
	}
	for _, name := range c.pods {
		return name
	}
	return ""
}
