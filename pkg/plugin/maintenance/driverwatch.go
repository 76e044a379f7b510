package maintenance

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
	"k8s.io/klog/v2"
)

// Watch looks, every Interval until ctx ends, at the operators'
// maintenance requests and at the version of the driver installed under
// the driver root.
//
// A changed version means the driver was upgraded under the plugin: the
// common CDI edits computed at start name libraries the upgrade removed
// (libcuda.so.<old>), and every container started from then on would fail
// to load CUDA. The plugin then lets go of the GPUs (if the operator had
// not released them for the upgrade) and reacquires them; since this
// process cannot load another version of the NVML library, the reacquire
// ends in a new process (Options.Restart: the plugin executes
// itself again), which waits for the new kernel module as any start does
// and discovers the new version's files. Nothing is prepared meanwhile,
// so no claim gets the old files. Claims already prepared keep their
// specs: their containers keep running on the driver they started with,
// and get the new one when their pods are replaced. So the GPU Operator's
// upgrade, once the GPUs were released for it, ends with the plugin
// serving the new driver without another step.
func (m *Maintenance) Watch(ctx context.Context) {
	if m == nil || m.opts.Session == nil {
		return
	}
	m.writeStatus(ctx, StateServing, "", nil)
	go func() {
		t := time.NewTicker(m.interval())
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			m.Tick(ctx)
		}
	}()
}

func (m *Maintenance) interval() time.Duration {
	if m.opts.Interval > 0 {
		return m.opts.Interval
	}
	return nvdev.DriverRetryInterval
}

// Tick is one look of Watch: it handles the pending request, then follows
// the GPU Operator's upgrade and the driver.
func (m *Maintenance) Tick(ctx context.Context) {
	if req, ok := takeRequest(ctx, m.opts.Dir); ok {
		m.handleRequest(ctx, req)
	}
	if m.followUpgradeState(ctx) {
		return
	}
	m.followDriverVersion(ctx)
}

// handleRequest carries an operator's request out and answers it.
func (m *Maintenance) handleRequest(ctx context.Context, req request) {
	logger := klog.FromContext(ctx)
	logger.Info("Maintenance requested by an operator", "action", req.Action, "request", req.ID)
	switch req.Action {
	case ActionRelease:
		err := m.Release(ctx, "requested by an operator (dra-kubelet-plugin --release-gpus)")
		m.writeStatus(ctx, m.stateName(), req.ID, err)
	case ActionReacquire:
		m.writeStatus(ctx, StateReacquiring, req.ID, nil)
		err := m.Reacquire(ctx, "requested by an operator (dra-kubelet-plugin --reacquire-gpus)", m.waitingForDriver(ctx))
		if errors.Is(err, nvdev.ErrNewProcessNeeded) && m.opts.Restart != nil {
			m.writeStatus(ctx, StateRestarting, req.ID, nil)
			return
		}
		if err != nil {
			logger.Error(err, "Reacquiring the GPUs")
			m.host.Events.Warn(ReasonReacquireFailed, "Reacquire", "GPUs not reacquired at an operator's request: %v", err)
		}
		m.writeStatus(ctx, m.stateName(), req.ID, err)
	default:
		m.writeStatus(ctx, m.stateName(), req.ID, fmt.Errorf("unknown maintenance action %q", req.Action))
	}
}

func (m *Maintenance) stateName() string {
	if m.Released() {
		return StateReleased
	}
	return StateServing
}

// waitingForDriver logs, once a minute or so, that a reacquire waits for
// the driver.
func (m *Maintenance) waitingForDriver(ctx context.Context) func(error) {
	var last time.Time
	return func(err error) {
		if time.Since(last) < time.Minute {
			return
		}
		last = time.Now()
		klog.FromContext(ctx).Info("Reacquiring the GPUs: NVIDIA driver not ready; waiting", "driverRoot", m.opts.DriverRoot, "reason", err.Error())
	}
}

// followDriverVersion reopens NVML and the driver's files when the
// installed driver's version is no longer the one they were opened on.
// A reacquire that fails (the new libraries over the old kernel module,
// until it is reloaded) is tried again at the next look.
func (m *Maintenance) followDriverVersion(ctx context.Context) {
	installed := nvdev.InstalledDriverVersion(m.opts.DriverRoot)
	m.mu.Lock()
	known, announced := m.version, m.announced
	m.announced = installed
	m.mu.Unlock()
	// "" is a driver root without the library: between an unload and the
	// new driver's install, or a layout the version is not read from.
	if installed == "" || installed == known {
		return
	}
	why := fmt.Sprintf("driver upgraded from %s to %s", orUnknown(known), installed)
	if installed != announced {
		klog.FromContext(ctx).Info("Installed NVIDIA driver changed; reopening NVML and the driver's files for new claims", "from", known, "to", installed)
		m.host.Events.Normal(ReasonDriverVersionChanged, "Upgrade", "NVIDIA driver under %s changed from %s to %s: claims prepared from now on get its files; running containers keep the driver they started with until restarted",
			m.opts.DriverRoot, orUnknown(known), installed)
	}
	if err := m.Release(ctx, why); err != nil {
		klog.FromContext(ctx).Error(err, "Releasing the GPUs for a driver upgrade")
		return
	}
	err := m.Reacquire(ctx, why, m.waitingForDriver(ctx))
	if errors.Is(err, nvdev.ErrNewProcessNeeded) && m.opts.Restart != nil {
		m.writeStatus(ctx, StateRestarting, "", nil)
		return
	}
	if err != nil {
		klog.FromContext(ctx).Error(err, "Reacquiring the GPUs after a driver upgrade; trying again", "driverVersion", installed)
		m.mu.Lock()
		first := m.failedFor != installed
		m.failedFor = installed
		m.mu.Unlock()
		if first {
			m.host.Events.Warn(ReasonReacquireFailed, "Upgrade", "GPUs not reacquired on driver %s (trying again every %s): %v", installed, m.interval(), err)
		}
	}
	m.writeStatus(ctx, m.stateName(), "", nil)
}

func orUnknown(v string) string {
	if v == "" {
		return "an unknown version"
	}
	return v
}
