package posture

import (
	"fmt"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
)

// Taint keys the plugin sets (pkg/health: TaintKeyPrefix + kind), repeated
// here for the reason given at the attribute names; a test checks them.
const (
	pluginTaintPrefix    = "gpu.gpuaas.io/"
	taintCleanupBlocked  = pluginTaintPrefix + "cleanup-blocked"
	taintUnmonitoredKind = pluginTaintPrefix + "unmonitored"
)

// gpuTaints sorts what taints a GPU's devices by what it means.
type gpuTaints struct {
	unhealthy, cleanupBlocked, draining, informational findings
}

// taints classifies the device taints the slices carry and the
// DeviceTaintRules that select the GPU's devices.
func (g *gpu) taints(poolName string, rules []resourceapi.DeviceTaintRule) gpuTaints {
	var t gpuTaints
	for _, d := range g.devices {
		for _, taint := range d.api.Taints {
			t.classify(d.api.Name, taint)
		}
		for i := range rules {
			r := &rules[i]
			if KeepsWorkOff(r.Spec.Taint.Effect) && RuleSelects(r, DriverName, poolName, d.api.Name) {
				t.draining.add(fmt.Sprintf("DeviceTaintRule %s (%s)", r.Name, taintString(r.Spec.Taint)), d.api.Name)
			}
		}
	}
	return t
}

// classify files one taint of a device. The plugin's own keys are health
// findings; any other key was put there by someone else (an admin tool
// patching the slice, a future Kubernetes feature) and counts as a drain
// when it keeps work off the device.
func (t *gpuTaints) classify(dev string, taint resourceapi.DeviceTaint) {
	label := taintString(taint)
	switch {
	case !strings.HasPrefix(taint.Key, pluginTaintPrefix):
		if KeepsWorkOff(taint.Effect) {
			t.draining.add("taint "+label, dev)
		}
	case !KeepsWorkOff(taint.Effect) || taint.Key == taintUnmonitoredKind:
		t.informational.add(label, dev)
	case taint.Key == taintCleanupBlocked:
		t.cleanupBlocked.add(label, dev)
	default:
		t.unhealthy.add(label, dev)
	}
}

// KeepsWorkOff: NoSchedule and NoExecute keep new claims away. None is
// informational, and the API says unknown effects count as None.
func KeepsWorkOff(e resourceapi.DeviceTaintEffect) bool {
	return e == resourceapi.DeviceTaintEffectNoSchedule || e == resourceapi.DeviceTaintEffectNoExecute
}

// RuleSelects reports whether a DeviceTaintRule taints a device of a
// driver's pool. Without a selector a rule selects nothing; each set field
// of the selector must match. (The selector's CEL selectors were
// tombstoned in resource.k8s.io/v1 before they went GA, so driver, pool
// and device are all there is to match.)
func RuleSelects(r *resourceapi.DeviceTaintRule, driver, pool, device string) bool {
	s := r.Spec.DeviceSelector
	if s == nil {
		return false
	}
	return (s.Driver == nil || *s.Driver == driver) &&
		(s.Pool == nil || *s.Pool == pool) &&
		(s.Device == nil || *s.Device == device)
}

func taintString(t resourceapi.DeviceTaint) string {
	s := t.Key
	if t.Value != "" {
		s += "=" + t.Value
	}
	return s + ":" + string(t.Effect)
}

// findings are taints by label, with the devices each covers, in the
// order first seen (the slices' order, so the reason is stable).
type findings struct {
	labels  []string
	devices map[string][]string
}

func (f *findings) add(label, dev string) {
	if f.devices == nil {
		f.devices = map[string][]string{}
	}
	if _, ok := f.devices[label]; !ok {
		f.labels = append(f.labels, label)
	}
	f.devices[label] = append(f.devices[label], dev)
}

func (f *findings) empty() bool { return len(f.labels) == 0 }

// describe is e.g. "gpu.gpuaas.io/xid=79:NoSchedule on all 4 devices;
// taint x=y:NoExecute on gpu-0-mig-1g10gb-6".
func (f *findings) describe(of int) string {
	parts := make([]string, 0, len(f.labels))
	for _, l := range f.labels {
		parts = append(parts, l+" on "+coverage(f.devices[l], of))
	}
	return strings.Join(parts, "; ")
}

// coverage says which of a GPU's of devices a taint covers: a GPU offered
// as 29 MIG devices and a whole GPU must not read as healthy because one
// partition is named.
func coverage(devs []string, of int) string {
	switch {
	case len(devs) == 1 && of == 1:
		return devs[0]
	case len(devs) >= of:
		return fmt.Sprintf("all %d devices", of)
	case len(devs) == 1:
		return fmt.Sprintf("%s (1 of %d devices)", devs[0], of)
	}
	return fmt.Sprintf("%d of %d devices (%s, ...)", len(devs), of, devs[0])
}
