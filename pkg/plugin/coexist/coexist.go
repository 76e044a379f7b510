// Package coexist decides which of the node's GPUs the plugin stands
// aside from while a device plugin hands them out too, as the kubelet's
// PodResources API tells. It publishes nothing itself: the plugin asks
// it (Ask, Apply) and offers the GPUs it does not withhold (Withheld).
package coexist

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/gpuaas/gpu-dra-driver/pkg/deviceplugins"
	"github.com/gpuaas/gpu-dra-driver/pkg/mig"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/telemetry"
	"k8s.io/klog/v2"
)

// Coexistence is what the plugin does while a device plugin (NVIDIA's
// k8s-device-plugin, the GPU Operator's default) hands out this node's
// NVIDIA GPUs too: both would give the same GPU to different pods.
type Coexistence string

const (
	// CoexistenceStandDown publishes no device at all while any device
	// plugin advertises NVIDIA GPUs on the node (the default: nothing can
	// be handed out twice, whatever the device plugin's ID scheme).
	CoexistenceStandDown Coexistence = "stand-down"
	// CoexistenceExcludeOwned publishes only the GPUs no device plugin
	// hands out: a GPU is the device plugin's if any of its IDs, replicas
	// or MIG devices is advertised, or held by a running pod.
	CoexistenceExcludeOwned Coexistence = "exclude-owned"
	// CoexistenceOff does not look (no PodResources socket needed).
	CoexistenceOff Coexistence = "off"
)

// Coexistences are the valid values, for flags and their help.
var Coexistences = []Coexistence{CoexistenceStandDown, CoexistenceExcludeOwned, CoexistenceOff}

// ParseCoexistence checks a --device-plugin-coexistence value; empty is
// off, as in DevicePluginCheck.
func ParseCoexistence(s string) (Coexistence, error) {
	if s == "" {
		return CoexistenceOff, nil
	}
	if c := Coexistence(s); slices.Contains(Coexistences, c) {
		return c, nil
	}
	return "", fmt.Errorf("device plugin coexistence %q: want one of %v", s, Coexistences)
}

// DefaultDevicePluginCheckInterval is how often the kubelet is asked
// again: a device plugin is installed or removed during a migration, and
// the node follows within this long.
const DefaultDevicePluginCheckInterval = 30 * time.Second

// DevicePluginCheck configures the device-plugin check.
type DevicePluginCheck struct {
	// Coexistence is what to do; "" is CoexistenceOff.
	Coexistence Coexistence
	// Socket is the kubelet's PodResources socket; "" is
	// deviceplugins.DefaultSocket.
	Socket string
	// Interval between checks; zero is DefaultDevicePluginCheckInterval,
	// negative only at start.
	Interval time.Duration
}

// Node event reasons of the device-plugin check.
const (
	// ReasonDevicePluginStandDown: a device plugin advertises NVIDIA GPUs
	// on the node, which publishes none (stand-down).
	ReasonDevicePluginStandDown = "DevicePluginStandDown"
	// ReasonDevicePluginGPUsExcluded: GPUs a device plugin hands out are
	// not published (exclude-owned).
	ReasonDevicePluginGPUsExcluded = "DevicePluginGPUsExcluded"
	// ReasonDevicePluginGone (Normal): no device plugin hands out the
	// node's GPUs any more; all of them are published again.
	ReasonDevicePluginGone = "DevicePluginGone"
	// ReasonDevicePluginCheckFailed: the kubelet's PodResources API could
	// not be read, so whether a device plugin hands out the GPUs is
	// unknown.
	ReasonDevicePluginCheckFailed = "DevicePluginCheckFailed"
)

// Watch decides which GPUs are withheld because a device plugin hands
// them out. Apply and Withheld are called under one lock of the caller's
// (the plugin's publishing lock), which guards its state.
//
// An unanswered check (no socket, an API error) is "unknown". Before any
// check has answered, unknown publishes every GPU, with a warning: a
// missing socket nearly always means the plugin's pod does not mount the
// kubelet's pod-resources directory (an older chart, a custom DaemonSet)
// rather than a device plugin, and standing down on it would take GPU
// nodes out of service for a mount. Once a check has answered, unknown
// keeps that answer: a kubelet restart must not flap what is published.
type Watch struct {
	check   DevicePluginCheck
	lib     nvdev.Interface
	gpus    []deviceplugins.GPU
	events  telemetry.NodeEvents
	metrics *telemetry.Metrics

	withheld map[string]bool // GPU UUIDs not published
	answered bool            // a check has answered
	failing  bool            // the last check failed (said once per streak)
	said     string          // the last answer logged, to log changes only
}

// NewWatch is the check's watch of the GPUs of lib; nil when the check is
// off.
func NewWatch(check DevicePluginCheck, lib nvdev.Interface, events telemetry.NodeEvents, metrics *telemetry.Metrics) *Watch {
	if check.Coexistence == "" || check.Coexistence == CoexistenceOff {
		return nil
	}
	if check.Socket == "" {
		check.Socket = deviceplugins.DefaultSocket
	}
	if check.Interval == 0 {
		check.Interval = DefaultDevicePluginCheckInterval
	}
	w := &Watch{check: check, lib: lib, events: events, metrics: metrics}
	for _, g := range lib.GPUs() {
		w.gpus = append(w.gpus, deviceplugins.GPU{Index: g.Index, UUID: g.UUID})
	}
	return w
}

// Withheld are the GPUs (by UUID) not to publish now; nil without a
// check.
func (w *Watch) Withheld() map[string]bool {
	if w == nil {
		return nil
	}
	return w.withheld
}

// Answer is one check's answer: what the kubelet reports, or why it did
// not.
type Answer struct {
	resources []deviceplugins.Resource
	own       deviceplugins.Ownership
	err       error
}

// Ask asks the kubelet which GPUs a device plugin hands out; it takes no
// lock. ok is false when ctx ended meanwhile (shutting down: not a failed
// check).
func (w *Watch) Ask(ctx context.Context) (a Answer, ok bool) {
	a.resources, a.err = deviceplugins.Read(ctx, w.check.Socket)
	if ctx.Err() != nil {
		return a, false
	}
	if a.err == nil {
		a.own = deviceplugins.Owners(a.resources, w.gpus, w.migParents)
	}
	return a, true
}

// Apply takes an answer and reports whether the GPUs withheld changed.
func (w *Watch) Apply(ctx context.Context, a Answer) bool {
	return w.apply(ctx, a.resources, a.own, a.err)
}

// Interval is how often to check again; negative: only at start.
func (w *Watch) Interval() time.Duration { return w.check.Interval }

// migParents maps the UUIDs of the MIG devices that exist now to their
// GPUs' (a device plugin with a MIG strategy advertises MIG UUIDs).
func (w *Watch) migParents() map[string]string {
	out := map[string]string{}
	for _, g := range w.lib.GPUs() {
		if !g.MigCapable {
			continue
		}
		dev, err := w.lib.DeviceByUUID(g.UUID)
		if err != nil {
			continue
		}
		insts, err := mig.List(dev)
		if err != nil {
			continue // its MIG devices stay unmatched, and are logged so
		}
		for _, in := range insts {
			out[in.UUID] = g.UUID
		}
	}
	return out
}

// apply takes one check's answer (err: none) and reports whether the
// GPUs withheld changed.
func (w *Watch) apply(ctx context.Context, resources []deviceplugins.Resource, own deviceplugins.Ownership, err error) bool {
	logger := klog.FromContext(ctx).WithValues("coexistence", w.check.Coexistence, "podResourcesSocket", w.check.Socket)
	if err != nil {
		w.metrics.SetDevicePluginCheckFailed(true)
		if w.failing {
			logger.V(2).Info("Device plugin check still failing", "err", err)
			return false
		}
		w.failing = true
		then := "publishing every GPU until it answers"
		if w.answered {
			then = "keeping its last answer until it answers again"
		}
		logger.Error(err, "Cannot tell whether a device plugin hands out this node's GPUs: the kubelet's PodResources API does not answer; "+then)
		w.events.Warn(ReasonDevicePluginCheckFailed, "CheckDevicePlugins", "%s", eventNote(
			"Cannot read the kubelet's PodResources API at %s (%v), so cannot tell whether a device plugin hands out this node's NVIDIA GPUs too; %s. "+
				"Mount the kubelet's pod-resources directory into the plugin (the chart does), or set kubeletPlugin.devicePluginCoexistence=off.",
			w.check.Socket, err, then))
		return false
	}
	if w.failing {
		logger.Info("The kubelet's PodResources API answers again")
	}
	w.failing, w.answered = false, true
	w.metrics.SetDevicePluginCheckFailed(false)

	withheld := w.decide(resources, own)
	said := fmt.Sprint(deviceplugins.Summary(resources), own.Unmatched, slices.Sorted(maps.Keys(withheld)))
	if said != w.said && len(own.Unmatched) > 0 {
		logger.Info("Device plugin IDs that name no GPU of this node (not readable by NVML, or an ID scheme not known here)", "ids", own.Unmatched)
	}
	w.said = said
	if maps.Equal(withheld, w.withheld) {
		return false
	}
	before := len(w.withheld)
	w.withheld = withheld
	w.metrics.SetDevicePluginWithheld(len(withheld))
	w.report(logger, resources, own, before)
	return true
}

// decide is the GPUs withheld for an answer.
func (w *Watch) decide(resources []deviceplugins.Resource, own deviceplugins.Ownership) map[string]bool {
	out := map[string]bool{}
	switch {
	case len(resources) == 0:
	case w.check.Coexistence == CoexistenceStandDown:
		for _, g := range w.gpus {
			out[g.UUID] = true
		}
	case w.check.Coexistence == CoexistenceExcludeOwned:
		for uuid := range own.ByGPU {
			out[uuid] = true
		}
	}
	return out
}

// report says what changed: a log line and a Node event.
func (w *Watch) report(logger klog.Logger, resources []deviceplugins.Resource, own deviceplugins.Ownership, before int) {
	summary := deviceplugins.Summary(resources)
	switch {
	case len(w.withheld) == 0 && before > 0:
		logger.Info("No device plugin hands out this node's NVIDIA GPUs any more; publishing all of them again", "gpus", len(w.gpus))
		w.events.Normal(ReasonDevicePluginGone, "CheckDevicePlugins",
			"No device plugin hands out this node's NVIDIA GPUs any more: publishing all %d again.", len(w.gpus))
	case len(w.withheld) == 0:
		// Nothing was withheld and nothing is: only the IDs changed.
	case w.check.Coexistence == CoexistenceStandDown:
		logger.Error(nil, "A device plugin advertises NVIDIA GPUs on this node; publishing no devices, so that no GPU is handed out twice",
			"resources", summary, "withheldGPUs", len(w.withheld))
		w.events.Warn(ReasonDevicePluginStandDown, "CheckDevicePlugins", "%s", eventNote(
			"A device plugin advertises NVIDIA GPUs on this node (%s): publishing none of its %d GPUs, so that no GPU is handed out twice. "+
				"Keep the device plugin off this node (docs/migrating-from-device-plugin.md), or set kubeletPlugin.devicePluginCoexistence=exclude-owned.",
			summary, len(w.gpus)))
	default:
		var gpus, ids []string
		for _, g := range w.gpus {
			if w.withheld[g.UUID] {
				gpus = append(gpus, fmt.Sprintf("GPU %d (%s)", g.Index, g.UUID))
				ids = append(ids, own.ByGPU[g.UUID]...)
			}
		}
		logger.Error(nil, "A device plugin hands out some of this node's NVIDIA GPUs; not publishing those", "resources", summary,
			"withheldGPUs", gpus, "deviceIDs", ids)
		w.events.Warn(ReasonDevicePluginGPUsExcluded, "CheckDevicePlugins", "%s", eventNote(
			"A device plugin hands out %d of this node's %d NVIDIA GPUs (%s): not publishing %s.", len(w.withheld), len(w.gpus),
			summary, strings.Join(gpus, ", ")))
	}
}

// maxEventNote is the longest note the API server takes (it refuses the
// event otherwise).
const maxEventNote = 1024

// eventNote formats a note and cuts it to what the API server takes: a
// node of many GPUs, or a long error, must not lose the event.
func eventNote(format string, args ...any) string {
	note := fmt.Sprintf(format, args...)
	if len(note) <= maxEventNote {
		return note
	}
	return strings.ToValidUTF8(note[:maxEventNote-3], "") + "..."
}
