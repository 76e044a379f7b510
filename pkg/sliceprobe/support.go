// Package sliceprobe finds out, before the plugin publishes anything, which
// ResourceSlice fields the cluster's API server keeps: Kubernetes 1.34 to
// 1.37 differ in where counter sets may be, whether device taints and their
// effect None exist, how many taints a device may have, and whether a
// device may be allocated more than once (consumable capacity). Fields
// behind a disabled feature gate are dropped silently, so the plugin asks
// the API server itself, with a server-side dry run of each shape it would
// publish, rather than trusting a version number or the docs. Only where it
// cannot ask does the version count: from 1.38 the gates of counter sets
// and taints are locked on, so those are kept whatever the gates (Locked).
package sliceprobe

import (
	"fmt"
	"strings"
)

// CounterLayout is where the API server lets a device find the counter set
// it consumes (KEP-4815; its two revisions are incompatible).
type CounterLayout string

const (
	// CountersDropped: partitionable devices are off (the gate
	// DRAPartitionableDevices, alpha and off by default in 1.34 and 1.35);
	// counter sets and consumption are dropped.
	CountersDropped CounterLayout = "Dropped"
	// CountersInDeviceSlice: 1.34 with the gate on; a device consumes only
	// counter sets its own slice defines, at most 32 counters per slice.
	CountersInDeviceSlice CounterLayout = "InDeviceSlice"
	// CountersInOwnSlices: 1.35 and newer with the gate on (on by default
	// from 1.36); counter sets are in slices of their own.
	CountersInOwnSlices CounterLayout = "InOwnSlices"
)

// Support is what the cluster keeps of the slices the plugin publishes.
type Support struct {
	Counters CounterLayout `json:"counters"`
	// Taints: device taints are kept (DRADeviceTaints).
	Taints bool `json:"taints"`
	// TaintEffectNone: a taint may have effect None (1.35 and newer).
	TaintEffectNone bool `json:"taintEffectNone"`
	// MaxTaints is how many taints a device may have (4 in 1.34, 16 later).
	MaxTaints int `json:"maxTaints"`
	// ConsumableCapacity: a device may be allocated to several claims, each
	// taking part of its capacity (DRAConsumableCapacity).
	ConsumableCapacity bool `json:"consumableCapacity"`
	// ServerVersion is the API server's gitVersion when it was probed.
	ServerVersion string `json:"serverVersion,omitempty"`
}

// Full is what the newest Kubernetes keeps with its default gates: the
// slices the plugin builds, unchanged.
var Full = Support{Counters: CountersInOwnSlices, Taints: true, TaintEffectNone: true, MaxTaints: 16, ConsumableCapacity: true}

// Least is what the oldest supported Kubernetes keeps with its default
// gates: the plugin's answer while it cannot ask (fail closed).
var Least = Support{Counters: CountersDropped, MaxTaints: 0}

// lockedFrom is the first minor whose API server cannot drop what Locked
// says: Kubernetes 1.38 made DRAPartitionableDevices and DRADeviceTaints
// GA and locked them on (DRADeviceTaintRules too); DRAConsumableCapacity
// went GA there but can still be turned off (issue 57).
const lockedFrom = 38

// Locked is what the API server of gitVersion keeps whatever its gates:
// from 1.38, counter sets in slices of their own, device taints with
// effect None and 16 taints a device (the locked gates), but not
// necessarily devices allocated to several claims. For an older or
// unreadable version it is Least. An answer the plugin may publish by when
// it cannot ask: a field it cannot drop is never dropped silently.
func Locked(gitVersion string) Support {
	var major, minor int
	if _, err := fmt.Sscanf(strings.TrimPrefix(gitVersion, "v"), "%d.%d", &major, &minor); err != nil || major != 1 || minor < lockedFrom {
		return Least
	}
	l := Full
	l.ConsumableCapacity = false
	return l
}

// Gap is a feature the cluster lacks and what the plugin does without it.
type Gap struct {
	Feature string // as in the docs, e.g. "partitionable devices"
	Gate    string // the feature gate that brings it
	Effect  string // what the plugin offers instead
}

func (g Gap) String() string {
	return fmt.Sprintf("%s (feature gate %s): %s", g.Feature, g.Gate, g.Effect)
}

// The gaps a cluster may have, in a fixed order.
var (
	gapCounters = Gap{"partitionable devices", "DRAPartitionableDevices",
		"dynamic MIG GPUs are not offered, and no device consumes GPU milliunits (Kueue's counter-based quota)"}
	gapCountersApart = Gap{"counter sets in slices of their own (Kubernetes 1.35)", "DRAPartitionableDevices",
		"each GPU's counter set is published beside its devices; the MIG placement order of issue 29 is not kept"}
	gapTaints = Gap{"device taints", "DRADeviceTaints",
		"a device with a fault that keeps work off is not offered, instead of being tainted"}
	gapTaintNone = Gap{"device taints with effect None (Kubernetes 1.35)", "DRADeviceTaints",
		"faults that only inform (effect None) are not published as taints"}
	gapCapacity = Gap{"consumable capacity", "DRAConsumableCapacity",
		"memory shares are not offered"}
)

// AllGaps is every gap a cluster may have: the metric has a series for
// each, 1 where the cluster has it, so that an alert on it has data.
func AllGaps() []Gap {
	return []Gap{gapCounters, gapCountersApart, gapTaints, gapTaintNone, gapCapacity}
}

// Gaps lists what s lacks against Full, in AllGaps' order.
func (s Support) Gaps() []Gap {
	var out []Gap
	switch s.Counters {
	case CountersDropped:
		out = append(out, gapCounters)
	case CountersInDeviceSlice:
		out = append(out, gapCountersApart)
	}
	if !s.Taints {
		out = append(out, gapTaints)
	} else if !s.TaintEffectNone {
		out = append(out, gapTaintNone)
	}
	if !s.ConsumableCapacity {
		out = append(out, gapCapacity)
	}
	return out
}

// String is a one-line summary for logs.
func (s Support) String() string {
	gaps := s.Gaps()
	if len(gaps) == 0 {
		return "everything the plugin publishes is kept"
	}
	parts := make([]string, len(gaps))
	for i, g := range gaps {
		parts[i] = g.Feature + " missing (" + g.Gate + ")"
	}
	return strings.Join(parts, "; ")
}
