package plugin

import (
	"context"
	"slices"
	"time"

	"github.com/gpuaas/gpu-dra-driver/pkg/health"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
)

// watchingTimeout bounds how long the first publish waits for the health
// monitor to watch every GPU.
const watchingTimeout = 10 * time.Second

// watchHealth subscribes the driver to the monitor's changes: each one
// republishes the slices (taints) and wakes the kubelet's health streams.
// d.health is set before anything that reads it starts (the status writer
// reads the faults from another goroutine).
func (d *Driver) watchHealth(ctx context.Context) {
	monitor := d.health
	if monitor == nil {
		return
	}
	select {
	case <-monitor.Watching():
	case <-ctx.Done():
	case <-time.After(watchingTimeout):
		klog.FromContext(ctx).Info("Health monitor not watching yet; publishing without it", "waited", watchingTimeout)
	}
	// The kubelet's health stream may already read it (under d.mu).
	d.mu.Lock()
	d.healthChanged = make(chan struct{})
	d.mu.Unlock()
	monitor.OnChange(func() {
		d.mu.Lock()
		close(d.healthChanged)
		d.healthChanged = make(chan struct{})
		err := d.publishLocked(ctx)
		d.mu.Unlock()
		if err != nil {
			klog.FromContext(ctx).Error(err, "Publishing device taints")
		}
		d.status.all(ctx)
	})
}

// faults are the monitor's current faults (none without a monitor), and
// the maintenance taints while the GPUs are released.
func (d *Driver) faults() []health.Fault {
	if d.health == nil {
		return d.maint.Faults()
	}
	return append(d.health.Faults(), d.maint.Faults()...)
}

// WatchHealthStatus implements kubeletplugin.DRAPlugin: a report of every
// published device now, then on every change of the faults, and at least
// every healthResendInterval so that the kubelet never calls a device's
// health unknown while the plugin runs.
func (d *Driver) WatchHealthStatus(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	if d.health == nil {
		return kubeletplugin.ErrHealthNotSupported
	}
	// The first report lists the devices the start's check leaves.
	if err := d.waitChecked(ctx); err != nil {
		return nil
	}
	ticker := time.NewTicker(healthResendInterval)
	defer ticker.Stop()
	for {
		d.mu.Lock()
		report := healthReport(d.nodeName, append(slices.Clip(d.inv.Devices), d.orphans...), d.health.Faults(), time.Now())
		changed := d.healthChanged
		d.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil
		case reports <- report:
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		case <-changed:
		}
	}
}
