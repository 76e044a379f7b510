package plugin

import (
	"context"
	"time"

	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/inventory"
	"k8s.io/klog/v2"
)

// checkDevicePlugins asks the kubelet and applies the answer (package
// coexist); with publish, a changed answer is published at once (the
// first check, at start, comes before the first publish).
func (d *Driver) checkDevicePlugins(ctx context.Context, publish bool) {
	w := d.dp
	if w == nil {
		return
	}
	answer, ok := w.Ask(ctx)
	if !ok {
		return // shutting down: not a failed check
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if !w.Apply(ctx, answer) || !publish {
		return
	}
	if err := d.publishLocked(ctx); err != nil {
		klog.FromContext(ctx).Error(err, "Publishing after a device plugin change")
	}
}

// watchDevicePlugins checks again every interval until ctx ends.
func (d *Driver) watchDevicePlugins(ctx context.Context) {
	if d.dp == nil || d.dp.Interval() < 0 {
		return
	}
	go func() {
		t := time.NewTicker(d.dp.Interval())
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			d.checkDevicePlugins(ctx, true)
		}
	}()
}

// publishable is what is published now: the inventory less the GPUs a
// device plugin hands out. Called with d.mu held.
func (d *Driver) publishable() inventory.Inventory {
	return d.inv.WithoutGPUs(d.dp.Withheld())
}
