package plugin

import (
	"context"

	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/maintenance"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/telemetry"
	"k8s.io/klog/v2"
)

// startMaintenance sets the maintenance state up at start (package
// maintenance), and runs the health monitor where it is the plugin's to
// run.
func (d *Driver) startMaintenance(ctx context.Context, opts Options, events telemetry.NodeEvents) {
	d.events = events
	d.maint = maintenance.New(opts.Maintenance, maintenance.Host{Health: opts.Health, Events: events, Metrics: d.metrics,
		FaultsChanged: d.faultsChanged})
	d.maint.Start(ctx, func() string { return opts.NVML.System().DriverVersion })
}

// NotReady is why the plugin is not ready though it runs (the GPUs are
// released for maintenance), nil when it is.
func (d *Driver) NotReady() error { return d.maint.Refusal() }

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
