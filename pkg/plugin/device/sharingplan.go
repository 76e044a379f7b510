package device

import (
	"cmp"
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"

	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/cdi"
	"github.com/gpuaas/gpu-dra-driver/pkg/health"
	"github.com/gpuaas/gpu-dra-driver/pkg/mps"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/checkpoint"
	"github.com/gpuaas/gpu-dra-driver/pkg/timeslice"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"
)

// sharingPlan is what one device of a claim needs of its GPU.
type sharingPlan struct {
	settings timeslice.Settings
	limits   *mps.Limits // MPS only
	// memoryLimit is the memory the driver is to hold the device's
	// container to (a replica's or a share's size), 0 for none.
	memoryLimit int64
}

func (p *sharingPlan) SettingsOrNil() *timeslice.Settings {
	if p == nil {
		return nil
	}
	s := p.settings
	return &s
}

// MemoryLimitBytes is the memory the driver is to hold the device's
// container to, 0 for none: a time-slice replica's or a memory share's
// size. MPS devices have none: their daemon pins each client's memory
// already (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT, bounded by the daemon's
// defaults), and the daemon, not the client's container, holds the GPU
// context the memory is allocated in, so a limit on the container's cgroup
// is not known to cover it.
func (p *sharingPlan) MemoryLimitBytes() int64 {
	if p == nil {
		return 0
	}
	return p.memoryLimit
}

func (p *sharingPlan) LimitsOrNil() *mps.Limits {
	if p == nil || p.limits == nil {
		return nil
	}
	l := *p.limits
	return &l
}

// ChangesGPU reports whether applying the settings may change the GPU,
// which must be recorded before it happens. Default-interval time-slicing
// changes nothing, so it costs no extra checkpoint write.
func (p *sharingPlan) ChangesGPU() bool {
	return p != nil && (p.settings.Strategy == configapi.MPSStrategy || p.settings.Interval.OrDefault() != configapi.DefaultTimeSlice)
}

// planGPUSharing plans a replica or share of memory mem: the GPU's
// settings, which the claim's config may restate but not change (they are
// per GPU; see configapi.SharedMode), and for MPS the client's limits.
func planGPUSharing(p Planned, gpu timeslice.Settings, mem int64) (*sharingPlan, error) {
	if asked := sharingOf(p.Config); asked != nil {
		switch {
		case asked.Strategy == configapi.ExclusiveStrategy:
			return nil, fmt.Errorf("a %s device shares its GPU by design; strategy %s cannot apply", p.Device.Type(), asked.Strategy)
		case asked.Strategy != "" && asked.Strategy != gpu.Strategy,
			gpu.Strategy == configapi.TimeSlicingStrategy && claimInterval(p.Config) != "" && claimInterval(p.Config) != gpu.Interval:
			wanted := timeslice.Settings{Strategy: cmp.Or(asked.Strategy, gpu.Strategy), Interval: claimInterval(p.Config)}
			return nil, fmt.Errorf("GPU %d is shared with %s (node configuration); this claim's config asks for %s: "+
				"sharing settings are per GPU, select a GPU that has them (attributes %s, %s)",
				p.Device.GPU.Index, gpu, wanted, timeslice.AttrSharingStrategy, timeslice.AttrTimeSliceInterval)
		}
	}
	if gpu.Strategy == configapi.MPSStrategy {
		return planMPS(p, mem)
	}
	return &sharingPlan{settings: gpu, memoryLimit: mem}, nil
}

// claimInterval is the interval a claim's config names, "" for none.
func claimInterval(cfg configapi.Interface) configapi.TimeSliceInterval {
	if sh := sharingOf(cfg); sh != nil && sh.TimeSlicingConfig != nil {
		return sh.TimeSlicingConfig.Interval
	}
	return ""
}

// planMPS derives the limits from the device's memory mem and that
// memory's share of the GPU. Those are caps, and the class's config may
// lower them; a claim's config may set limits within them, and what it
// leaves unset is the class's, else the share's. A limit above a cap is
// refused, naming the cap: a tenant cannot take more than it was sold.
func planMPS(p Planned, mem int64) (*sharingPlan, error) {
	if major, _, _ := strings.Cut(p.Device.GPU.CUDAComputeCapability, "."); atoi(major) < 7 {
		return nil, fmt.Errorf("MPS with limits needs compute capability 7.0 or newer; GPU %s has %s",
			p.Device.GPU.UUID, p.Device.GPU.CUDAComputeCapability)
	}
	share := shareLimits(mem, int64(p.Device.GPU.MemoryBytes))
	shareCaps := &configapi.MpsConfig{
		DefaultActiveThreadPercentage:  ptr.To(share.ThreadPercentage),
		DefaultPinnedDeviceMemoryLimit: resource.NewQuantity(mem, resource.BinarySI),
	}
	if err := p.ClassCaps.WithinCaps(shareCaps, "the device's share of its GPU"); err != nil {
		return nil, fmt.Errorf("the class's config: %w", err)
	}
	asked := configapi.MPSConfigOf(p.Config)
	for _, c := range []struct {
		caps   *configapi.MpsConfig
		source string
	}{{shareCaps, "the device's share of its GPU"}, {p.ClassCaps, "the class's config"}} {
		if err := asked.WithinCaps(c.caps, c.source); err != nil {
			return nil, err
		}
	}
	limits := share
	for _, cfg := range []*configapi.MpsConfig{p.ClassCaps, asked} { // the claim's last: it only lowers
		if cfg == nil {
			continue
		}
		if q := cfg.DefaultPinnedDeviceMemoryLimit; q != nil {
			limits.MemoryBytes = q.Value()
		}
		if t := cfg.DefaultActiveThreadPercentage; t != nil {
			limits.ThreadPercentage = *t
		}
	}
	return &sharingPlan{settings: timeslice.Settings{Strategy: configapi.MPSStrategy}, limits: &limits}, nil
}

// shareLimits are the MPS limits of mem bytes of a GPU of total bytes:
// that memory, and the same share of the GPU's threads (rounded up, 1..100).
func shareLimits(mem, total int64) mps.Limits {
	return mps.Limits{MemoryBytes: mem, ThreadPercentage: int(min(100, max(1, (mem*100+total-1)/total)))}
}

func sharingOf(cfg configapi.Interface) *configapi.Sharing {
	switch c := cfg.(type) {
	case *configapi.GpuConfig:
		return c.Sharing
	case *configapi.MigConfig:
		return c.Sharing
	}
	return nil
}

func atoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}

// holder names one device of one claim in the reference counts.
func holder(claimUID, device string) string { return claimUID + "/" + device }

// holdsSetting is what the kinds whose devices may hold a sharing
// setting of their GPU (whole GPU, replica, share) do with it: apply it at
// set-up, give an MPS client's container its daemon, release it at
// teardown. It is embedded by those kinds.
type holdsSetting struct{}

func (holdsSetting) ChangesGPU(p Planned) bool { return p.Sharing.ChangesGPU() }

func (holdsSetting) SetUp(ctx context.Context, e *Env, p *Planned, rec *checkpoint.Claim, _ int) error {
	return e.acquireSharing(ctx, *p, rec.UID)
}

// CDIDevice is the device's GPU with its sharing edits and, for a
// replica or a share, the memory limit its record keeps (the CDI handler
// writes it where the driver enforces it).
func (holdsSetting) CDIDevice(e *Env, p Planned, rec *checkpoint.Device) (cdi.Device, error) {
	d := gpuCDIDevice(p)
	d.Env, d.Mounts = e.sharingEdits(p)
	d.MemoryLimitBytes = rec.MemoryLimitBytes
	return d, nil
}

func (holdsSetting) TearDown(ctx context.Context, e *Env, rec *checkpoint.Claim, i int) error {
	return e.releaseSharing(ctx, rec.UID, &rec.Devices[i])
}

func (holdsSetting) Adopt(e *Env, uid string, d *checkpoint.Device) error {
	if d.Sharing == nil {
		return nil
	}
	return e.Sharing.mgr(d.GPUUUID).Adopt(d.GPUUUID, holder(uid, d.Device), *d.Sharing)
}

func (holdsSetting) MIGScope() *health.MIGScope { return nil }

// acquireSharing applies the device's settings to its GPU, or joins the
// claims already holding them.
func (e *Env) acquireSharing(ctx context.Context, p Planned, claimUID string) error {
	if p.Sharing == nil {
		return nil
	}
	gpu := p.Device.GPU.UUID
	if err := e.Sharing.mgr(gpu).Acquire(ctx, gpu, holder(claimUID, p.Device.Name()), p.Sharing.settings); err != nil {
		return err
	}
	if p.Sharing.limits == nil {
		return nil
	}
	// The daemon enforces what the client's environment only asks, for
	// every client of the GPU alike: what the node configuration sells on
	// it. Set at each client, so a daemon restarted since (Ensure) has them.
	return e.Sharing.mps.SetDefaults(ctx, gpu, daemonDefaults(p))
}

// daemonDefaults are the limits of the GPU's MPS daemon, which bind a
// client that drops its CUDA_MPS_* environment (the client's environment
// can only lower them). A whole GPU is one claim's: its limits. A
// replica or share is bounded by the largest device one claim may hold of
// the GPU as the node configuration publishes it (a replica; a share up to
// shared.memory.max, else the GPU), never by what a claim's config asks.
func daemonDefaults(p Planned) mps.Limits {
	if p.Device.Type() == TypeGPU {
		return *p.Sharing.limits
	}
	total := int64(p.Device.GPU.MemoryBytes)
	largest := total
	if c, ok := p.Device.API.Capacity["memory"]; ok {
		largest = c.Value.Value()
		if c.RequestPolicy != nil && c.RequestPolicy.ValidRange != nil && c.RequestPolicy.ValidRange.Max != nil {
			largest = min(largest, c.RequestPolicy.ValidRange.Max.Value())
		}
	}
	return shareLimits(largest, total)
}

// releaseSharing drops the hold of a recorded device; one whose release
// fails keeps its record, so unprepare is retried.
func (e *Env) releaseSharing(ctx context.Context, claimUID string, d *checkpoint.Device) error {
	if d.Sharing == nil {
		return nil
	}
	if err := e.Sharing.mgr(d.GPUUUID).Release(ctx, d.GPUUUID, holder(claimUID, d.Device)); err != nil {
		return fmt.Errorf("releasing %s of %s: %w", d.Sharing, d.Device, err)
	}
	return nil
}

// sharingEdits are what an MPS client container needs of its GPU's
// daemon: the environment with its limits, the pipe directory at the path
// the daemon listens on, and the shared memory at /dev/shm. Nothing for
// other devices.
func (e *Env) sharingEdits(p Planned) (map[string]string, []cdi.Mount) {
	if p.Sharing == nil || p.Sharing.limits == nil {
		return nil, nil
	}
	gpu := p.Device.GPU.UUID
	pipe := e.Sharing.mps.PipeDir(gpu)
	return e.Sharing.mps.ClientEnv(gpu, *p.Sharing.limits), []cdi.Mount{
		{HostPath: pipe, ContainerPath: pipe},
		{HostPath: e.Sharing.mps.ShmDir(gpu), ContainerPath: mps.ShmContainerPath},
	}
}

// MPSOnOneGPUPerRequest refuses a request whose MPS devices are on
// several GPUs: the containers that use a request get all its devices, and
// a CUDA process reaches one MPS control daemon (CUDA_MPS_PIPE_DIRECTORY
// names one), so all but one GPU would be silently out of its reach.
// Requests of one claim may go to different containers, so only a request
// is checked.
func MPSOnOneGPUPerRequest(plan []Planned) error {
	gpus := map[string]map[string]bool{}
	for _, p := range plan {
		if p.Sharing == nil || p.Sharing.limits == nil {
			continue
		}
		req := p.Result.Request
		if gpus[req] == nil {
			gpus[req] = map[string]bool{}
		}
		gpus[req][p.Device.GPU.UUID] = true
	}
	for req, set := range gpus {
		if len(set) > 1 {
			return fmt.Errorf("request %q has MPS devices on %d GPUs, but a container reaches one GPU's MPS daemon: "+
				"ask for MPS devices of one GPU per request (e.g. a matchAttribute constraint on %s/parentUUID or uuid), or one request per GPU",
				req, len(set), configapi.DriverName)
		}
	}
	return nil
}

// MPSDir is where the plugin keeps MPS pipes, next to its checkpoint.
func MPSDir(pluginDataDir string) string { return filepath.Join(pluginDataDir, "mps") }

// RecordedSharing is the sharing plan a recorded device was prepared
// with, so that setting it up again (after a reboot) applies the same
// settings; nil for none.
func RecordedSharing(d *checkpoint.Device) *sharingPlan {
	if d.Sharing == nil {
		return nil
	}
	return &sharingPlan{settings: *d.Sharing, limits: d.MPSLimits}
}
