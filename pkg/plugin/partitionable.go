package plugin

import (
	"context"
	"slices"

	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
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

// withdrawDynamicMIG stops offering the dynamic-MIG GPUs once the cluster
// is found to drop counters. Without counters nothing keeps the scheduler
// from handing out a GPU whole and its MIG slices, or overlapping slices,
// to different claims at once.
//
// The GPUs are not offered at all, rather than as whole GPUs: a GPU whose
// MIG mode needs a reset (Ampere) cannot be handed out whole in MIG mode;
// and on any of them, claims may already hold MIG slices (prepared, or
// allocated from the slices the API server stored without counters before
// this republish), which a whole GPU offered now would be allocated on top
// of, with nothing in the cluster counting them against it. Offering
// nothing cannot conflict with anything.
//
// Claims already allocated on these devices are still prepared: some were
// allocated while counters were in force, and NVML itself refuses the
// conflicting ones (overlapping placements, MIG mode off under a MIG
// device). The withdrawal lasts until the plugin restarts; a start
// publishes dynamic MIG again and checks again.
//
// The plugin has no event recorder (nor RBAC for events in the chart), so
// the reason is given by an error log and the
// gpuaas_dra_plugin_dynamic_mig_withdrawn_gpus gauge.
func (d *Driver) withdrawDynamicMIG(ctx context.Context, dropped *resourceslice.DroppedFieldsError) {
	logger := klog.FromContext(ctx)
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.withdrawn {
		return // every slice of the first publish reports it
	}
	inv, gpus := d.inv.withoutDynamicMIG()
	if len(gpus) == 0 {
		return // nothing of ours uses counters; HandleError logs the error
	}
	d.withdrawn, d.inv = true, inv
	d.metrics.setDynamicMIGWithdrawn(len(gpus))
	logger.Error(nil, "The API server drops the counters of partitionable devices (feature gate DRAPartitionableDevices off): "+
		"no longer offering the dynamic-MIG GPUs, whose whole GPU and MIG devices would be allocated to different claims at once; "+
		"enable the feature gate, or offer these GPUs whole or as static MIG, and restart the plugin",
		"pool", dropped.PoolName, "slice", dropped.SliceIndex, "gpus", gpus)
	if err := d.publishLocked(ctx); err != nil {
		logger.Error(err, "Republishing without dynamic MIG")
	}
}

// withoutDynamicMIG is the inventory less the dynamic-MIG GPUs' devices
// and every device and counter set that counters tie together, with the
// UUIDs of the GPUs left out.
func (inv Inventory) withoutDynamicMIG() (Inventory, []string) {
	out := Inventory{ownSlice: map[int]bool{}, layouts: map[string]*mig.Layout{}}
	var gpus []string
	for _, d := range inv.Devices {
		if d.Mode == configapi.MigDynamic || len(d.API.ConsumesCounters) > 0 {
			gpus = append(gpus, d.GPU.UUID)
			continue
		}
		out.add(d)
	}
	slices.Sort(gpus)
	return out, slices.Compact(gpus)
}
