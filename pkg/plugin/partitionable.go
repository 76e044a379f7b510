package plugin

import (
	"context"
	"slices"

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
	inv, gpus, stripped := d.inv.withoutCounters()
	if len(gpus) == 0 && stripped == 0 {
		return // nothing of ours uses counters; HandleError logs the error
	}
	d.withdrawn, d.inv = true, inv
	d.metrics.setDynamicMIGWithdrawn(len(gpus))
	logCountersDropped(klog.FromContext(ctx), dropped, gpus, stripped)
	if len(gpus) > 0 {
		d.state.events.warn(ReasonDynamicMIGWithdrawn, "PublishResources",
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

// withoutCounters is the inventory as a cluster without partitionable
// devices can take it: no counter sets; no device of a dynamic-MIG GPU, nor
// any other that consumes more than GPU milliunits; the rest less their GPU
// milliunits. It also returns the UUIDs of the GPUs whose devices are left
// out, and how many devices kept lost their GPU milliunits.
func (inv Inventory) withoutCounters() (Inventory, []string, int) {
	out := Inventory{ownSlice: map[int]bool{}, layouts: map[string]*mig.Layout{}}
	var gpus []string
	stripped := 0
	for _, d := range inv.Devices {
		had := len(d.API.ConsumesCounters) > 0
		// d is a copy: the consumption is replaced, never changed in place.
		d.API.ConsumesCounters = mig.WithoutMilliunits(d.API.ConsumesCounters)
		if d.onDynamicMIG() || len(d.API.ConsumesCounters) > 0 {
			gpus = append(gpus, d.GPU.UUID)
			continue
		}
		if had {
			stripped++
		}
		out.add(d)
	}
	slices.Sort(gpus)
	return out, slices.Compact(gpus), stripped
}

// deferPlacements moves the dynamic MIG devices that first fit should
// reach only after every GPU's others (mig.Layout.Deferred: the lower 3g
// of each GPU, the only place of 4g) out of their GPU's slice, into slices
// of their own after every other device. The allocator takes a pool's
// slices in order, so a 3g claim then takes the upper half of any GPU that
// has it free before a lower half anywhere (issue 29). A device keeps its
// name and its consumption of its own GPU's counter set: only the slice it
// is listed in changes, which the scheduler's view of allocated devices
// never depends on.
func (inv Inventory) deferPlacements() Inventory {
	out := Inventory{CounterSets: inv.CounterSets, units: inv.units, ownSlice: map[int]bool{}, layouts: inv.layouts}
	var deferred []AllocatableDevice
	newSlice := false // a moved device's slice start passes to the next
	for i, d := range inv.Devices {
		newSlice = newSlice || inv.ownSlice[i]
		if l, part := inv.layouts[d.GPU.UUID], d.Partition(); part != nil && l != nil && l.Deferred(*part) {
			deferred = append(deferred, d)
			continue
		}
		if newSlice {
			out.ownSlice[len(out.Devices)], newSlice = true, false
		}
		out.add(d)
	}
	if len(deferred) > 0 {
		out.ownSlice[len(out.Devices)] = true
		out.add(deferred...)
	}
	if newSlice {
		out.ownSlice[len(out.Devices)] = true
	}
	return out
}
