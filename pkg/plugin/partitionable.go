package plugin

import (
	"context"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/telemetry"

	"github.com/gpuaas/gpu-dra-driver/pkg/mig"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
)

// countersDropped reports whether the API server stored a slice without
// the counter sets or counter consumption we published: partitionable
// devices (DRAPartitionableDevices) are off in the cluster. It compares the
// slices themselves rather than the feature names the error prints.
func countersDropped(err *resourceslice.DroppedFieldsError) bool {
	desired, actual := err.DesiredSlice, err.ActualSlice
	if desired == nil || actual == nil {
		return false
	}
	if len(desired.Spec.SharedCounters) > len(actual.Spec.SharedCounters) {
		return true
	}
	for i := range min(len(desired.Spec.Devices), len(actual.Spec.Devices)) {
		if len(desired.Spec.Devices[i].ConsumesCounters) > len(actual.Spec.Devices[i].ConsumesCounters) {
			return true
		}
	}
	return false
}

// withdrawDynamicMIG stops publishing counters once the cluster is found
// to drop them: it stops offering the dynamic-MIG GPUs, and offers every
// other device without the GPU milliunits it consumed.
//
// Without counters nothing keeps the scheduler from handing out a dynamic
// MIG GPU whole and its MIG slices, or overlapping slices, to different
// claims at once. Those GPUs are not offered at all, rather than as whole
// GPUs: a GPU whose MIG mode needs a reset (Ampere) cannot be handed out
// whole in MIG mode; and on any of them, claims may already hold MIG slices
// (prepared, or allocated from the slices the API server stored without
// counters before this republish), which a whole GPU offered now would be
// allocated on top of, with nothing in the cluster counting them against
// it. Offering nothing cannot conflict with anything.
//
// Whole GPUs, time-slice replicas and static MIG devices stay: their only
// counter is Kueue's gpu-milliunits (a unit-only counter set per GPU),
// which keeps nothing apart that is not apart already, so without it they
// are as safe as before and only Kueue's counter-based quota loses them.
//
// Claims already allocated on withdrawn devices are still prepared: some
// were allocated while counters were in force, and NVML itself refuses the
// conflicting ones (overlapping placements, MIG mode off under a MIG
// device). The withdrawal lasts until the plugin restarts; a start
// publishes counters again and checks again.
//
// The reason is given by a Warning event on the Node, an error log and the
// gpuaas_dra_plugin_dynamic_mig_withdrawn_gpus gauge.
func (d *Driver) withdrawDynamicMIG(ctx context.Context, dropped *resourceslice.DroppedFieldsError) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.withdrawn {
		return // every slice of the first publish reports it
	}
	inv, gpus, stripped := d.inv.WithoutCounters()
	if len(gpus) == 0 && stripped == 0 {
		return // nothing of ours uses counters; HandleError logs the error
	}
	d.withdrawn, d.inv = true, inv
	d.metrics.SetDynamicMIGWithdrawn(len(gpus))
	logCountersDropped(klog.FromContext(ctx), dropped, gpus, stripped)
	if len(gpus) > 0 {
		d.events.Warn(telemetry.ReasonDynamicMIGWithdrawn, "PublishResources",
			"The API server drops the counters of partitionable devices (feature gate DRAPartitionableDevices off): "+
				"no longer offering dynamic MIG on %d GPU(s), whose whole GPU and MIG devices would be allocated to different claims at once; "+
				"enable the feature gate, or offer these GPUs whole or as static MIG, and restart the plugin", len(gpus))
	}
	if err := d.publishLocked(ctx); err != nil {
		klog.FromContext(ctx).Error(err, "Republishing without counters")
	}
}

func logCountersDropped(logger klog.Logger, dropped *resourceslice.DroppedFieldsError, gpus []string, stripped int) {
	const cause = "The API server drops the counters of partitionable devices (feature gate DRAPartitionableDevices off): "
	kv := []any{"pool", dropped.PoolName, "slice", dropped.SliceIndex}
	if len(gpus) > 0 {
		logger.Error(nil, cause+
			"no longer offering the dynamic-MIG GPUs, whose whole GPU and MIG devices would be allocated to different claims at once; "+
			"enable the feature gate, or offer these GPUs whole or as static MIG, and restart the plugin",
			append(kv, "gpus", gpus)...)
	}
	if stripped > 0 {
		logger.Error(nil, cause+"publishing the other devices without the "+mig.CounterGPUMilliunits+
			" counter, so Kueue's counter-based quota cannot charge them; enable the feature gate and restart the plugin, "+
			"or set gpuUnitCounters: false in the node configuration", append(kv, "devices", stripped)...)
	}
}
