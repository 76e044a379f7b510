package sliceprobe

import (
	"context"
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// Prober asks the API server what it keeps, by dry-run creates of small
// slices in the pool the plugin publishes (nothing is stored). The plugin's
// ServiceAccount may create slices for its own node only, which is all this
// needs.
type Prober struct {
	Client kubernetes.Interface
	Node   string
	Driver string
}

// outcome is what the API server did with a probe's field.
type outcome int

const (
	kept    outcome = iota // stored as sent
	dropped                // stored without it: its feature gate is off
	refused                // invalid in this version's API
)

// Probe asks each question in turn. An error means the API server could not
// be asked (unreachable, forbidden); the caller decides what to assume.
func (p Prober) Probe(ctx context.Context) (Support, error) {
	var s Support
	var err error
	if s.Counters, err = p.counters(ctx); err != nil {
		return s, err
	}
	if err = p.taints(ctx, &s); err != nil {
		return s, err
	}
	out, err := p.try(ctx, "a device allocated to several claims", []resourceapi.Device{sharedDevice()}, nil,
		func(got *resourceapi.ResourceSlice) bool {
			return ptr.Deref(got.Spec.Devices[0].AllowMultipleAllocations, false)
		})
	if err != nil {
		return s, err
	}
	s.ConsumableCapacity = out == kept
	if v, err := p.Client.Discovery().ServerVersion(); err == nil {
		s.ServerVersion = v.GitVersion
	}
	return s, nil
}

// Floor is what the API server cannot drop, by its version alone (Locked):
// for a cluster whose dry-run creates fail (forbidden, a webhook down)
// while its discovery answers. Least when not even that answers.
func (p Prober) Floor() Support {
	v, err := p.Client.Discovery().ServerVersion()
	if err != nil {
		return Least
	}
	return Locked(v.GitVersion)
}

const probeSet = "gpuaas-probe-counters"

// counters tries the 1.35 layout (a device consuming a set defined in
// another slice), then the 1.34 one (the set in the device's own slice).
func (p Prober) counters(ctx context.Context) (CounterLayout, error) {
	consumes := func(got *resourceapi.ResourceSlice) bool { return len(got.Spec.Devices[0].ConsumesCounters) > 0 }
	out, err := p.try(ctx, "counters in a slice of their own", []resourceapi.Device{consumingDevice()}, nil, consumes)
	if err != nil || out == kept {
		return CountersInOwnSlices, err
	}
	if out == dropped {
		return CountersDropped, nil
	}
	out, err = p.try(ctx, "counters beside their devices", []resourceapi.Device{consumingDevice()}, []resourceapi.CounterSet{counterSet()},
		func(got *resourceapi.ResourceSlice) bool { return consumes(got) && len(got.Spec.SharedCounters) > 0 })
	if err != nil || out != kept {
		return CountersDropped, err
	}
	return CountersInDeviceSlice, nil
}

// taints tries one NoSchedule taint, then effect None, then five taints
// (1.34 allows 4 per device), and fills in s's taint fields.
func (p Prober) taints(ctx context.Context, s *Support) error {
	has := func(n int) func(*resourceapi.ResourceSlice) bool {
		return func(got *resourceapi.ResourceSlice) bool { return len(got.Spec.Devices[0].Taints) == n }
	}
	out, err := p.try(ctx, "a device taint", []resourceapi.Device{taintedDevice(1, resourceapi.DeviceTaintEffectNoSchedule)}, nil, has(1))
	if err != nil || out != kept {
		return err
	}
	s.Taints = true
	if out, err = p.try(ctx, "a taint with effect None", []resourceapi.Device{taintedDevice(1, resourceapi.DeviceTaintEffectNone)}, nil, has(1)); err != nil {
		return err
	}
	s.TaintEffectNone = out == kept
	const oldMax = 4
	if out, err = p.try(ctx, "more than four taints", []resourceapi.Device{taintedDevice(oldMax+1, resourceapi.DeviceTaintEffectNoSchedule)}, nil, has(oldMax+1)); err != nil {
		return err
	}
	s.MaxTaints = oldMax
	if out == kept {
		s.MaxTaints = resourceapi.DeviceTaintsMaxLength
	}
	return nil
}

// try dry-runs the create of one slice and tells whether its probed field
// was kept (survived reports that on the stored slice), dropped or refused.
func (p Prober) try(ctx context.Context, what string, devices []resourceapi.Device, sets []resourceapi.CounterSet,
	survived func(*resourceapi.ResourceSlice) bool) (outcome, error) {
	slice := &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{GenerateName: p.Node + "-gpuaas-probe-"},
		Spec: resourceapi.ResourceSliceSpec{
			Driver:         p.Driver,
			NodeName:       ptr.To(p.Node),
			Pool:           resourceapi.ResourcePool{Name: p.Node, ResourceSliceCount: 1},
			Devices:        devices,
			SharedCounters: sets,
		},
	}
	got, err := p.Client.ResourceV1().ResourceSlices().Create(ctx, slice, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	switch {
	case apierrors.IsInvalid(err):
		return refused, nil
	case err != nil:
		return refused, fmt.Errorf("asking the API server whether it keeps %s (a dry-run create of a ResourceSlice): %w", what, err)
	case len(got.Spec.Devices) != len(devices) || !survived(got):
		return dropped, nil
	}
	return kept, nil
}

func counterSet() resourceapi.CounterSet {
	return resourceapi.CounterSet{Name: probeSet, Counters: map[string]resourceapi.Counter{
		"memory": {Value: resource.MustParse("1Gi")},
	}}
}

func consumingDevice() resourceapi.Device {
	return resourceapi.Device{Name: "probe", ConsumesCounters: []resourceapi.DeviceCounterConsumption{{
		CounterSet: probeSet, Counters: map[string]resourceapi.Counter{"memory": {Value: resource.MustParse("1Gi")}},
	}}}
}

func taintedDevice(n int, effect resourceapi.DeviceTaintEffect) resourceapi.Device {
	d := resourceapi.Device{Name: "probe"}
	for i := range n {
		d.Taints = append(d.Taints, resourceapi.DeviceTaint{Key: fmt.Sprintf("gpuaas.io/probe-%d", i), Effect: effect})
	}
	return d
}

func sharedDevice() resourceapi.Device {
	return resourceapi.Device{Name: "probe", AllowMultipleAllocations: ptr.To(true),
		Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{"memory": {Value: resource.MustParse("1Gi")}}}
}
