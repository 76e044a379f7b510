package admission

import (
	"context"
	"fmt"
	"slices"

	resourceapi "k8s.io/api/resource/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpuaas/gpu-dra-driver/pkg/quota"
)

// ForeignClasses are the DeviceClasses, sorted, that a claim can name
// without reaching our driver's devices: the webhook configuration's
// matchCondition sends their claims past the webhook.
func (a *Accountant) ForeignClasses(ctx context.Context) ([]string, error) {
	a.mu.Lock()
	cat, err := a.catalogLocked(ctx)
	a.mu.Unlock()
	if err != nil {
		return nil, err
	}
	// A class listed here but created after the snapshot is unknown to
	// the pricer, hence ours; one deleted since is not listed. Only the
	// classes in both can be foreign.
	var classes resourceapi.DeviceClassList
	if err := a.reader.List(ctx, &classes, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("listing DeviceClasses: %w", err)
	}
	var out []string
	for i := range classes.Items {
		dc := &classes.Items[i]
		// ClassIsOurs spares the pricer's walk over every published device
		// for the classes it calls ours without one: a sync runs on every
		// slice change.
		if !cat.pricer.ClassIsOurs(dc) && foreignClass(ctx, cat.pricer, dc) {
			out = append(out, dc.Name)
		}
	}
	slices.Sort(out)
	return out, nil
}

// foreignClass uses the webhook's own predicate: a class is foreign when
// the pricer charges nothing for one device of it, with no selectors of
// the request's own (those only narrow what the class selects), so no
// request naming it is ever charged. That is a class that exists, is no
// GpuProfile's, carries no selector naming our driver and selects none of
// our published devices. Two more are kept out, to be safe: a class being
// deleted (it is about to be unknown, which is ours) and a class without
// selectors, which selects every device, ours too once a node publishes
// some.
func foreignClass(ctx context.Context, p *quota.Pricer, dc *resourceapi.DeviceClass) bool {
	if !dc.DeletionTimestamp.IsZero() || len(dc.Spec.Selectors) == 0 {
		return false
	}
	probe := resourceapi.DeviceRequest{Name: "probe", Exactly: &resourceapi.ExactDeviceRequest{
		DeviceClassName: dc.Name, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1,
	}}
	return p.RequestCost(ctx, &probe).IsZero()
}

// ProfilesReached maps each DeviceClass to the GpuProfiles, sorted, whose
// published devices a claim naming it can be allocated: the profiles the
// pricer charges one device of the class to (a profile's own class reaches
// at least itself). The backstop (issue 36, route 6) gives every class
// that reaches a limited profile a line of its own: a ResourceQuota counts
// devices under the class a claim names, so a catch-all class, or one
// profile's class selecting another's devices, was a way around the lines
// of the classes the limits name. A class that reaches no published device
// of a profile maps to nothing but itself (if it is a profile's).
func (a *Accountant) ProfilesReached(ctx context.Context) (map[string][]string, error) {
	a.mu.Lock()
	cat, err := a.catalogLocked(ctx)
	a.mu.Unlock()
	if err != nil {
		return nil, err
	}
	var classes resourceapi.DeviceClassList
	if err := a.reader.List(ctx, &classes, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("listing DeviceClasses: %w", err)
	}
	out := make(map[string][]string, len(classes.Items))
	for i := range classes.Items {
		dc := &classes.Items[i]
		probe := resourceapi.DeviceRequest{Name: "probe", Exactly: &resourceapi.ExactDeviceRequest{
			DeviceClassName: dc.Name, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1,
		}}
		var reached []string
		for name := range cat.pricer.RequestCost(ctx, &probe).Devices {
			if cat.profiles[name] != nil {
				reached = append(reached, name)
			}
		}
		if ctx.Err() != nil { // a walk cut short reaches too little
			return nil, fmt.Errorf("working out the profiles each DeviceClass reaches: %w", context.Cause(ctx))
		}
		slices.Sort(reached)
		out[dc.Name] = reached
	}
	return out, nil
}
