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
	// A class listed here but created after the snapshot is unknown to
	// the pricer, hence ours; one deleted since is not listed. Only the
	// classes in both can be foreign.
	cat, classes, err := a.catalogAndClasses(ctx)
	if err != nil {
		return nil, err
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
	return p.RequestCost(ctx, classProbe(dc.Name)).IsZero()
}

// classProbe is a request for one device of the class, with no selectors
// of its own: what the class alone lets a claim get.
func classProbe(class string) *resourceapi.DeviceRequest {
	return &resourceapi.DeviceRequest{Name: "probe", Exactly: &resourceapi.ExactDeviceRequest{
		DeviceClassName: class, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1,
	}}
}

// catalogAndClasses are the pricing snapshot and the DeviceClasses listed
// after it.
func (a *Accountant) catalogAndClasses(ctx context.Context) (*priceList, *resourceapi.DeviceClassList, error) {
	a.mu.Lock()
	cat, err := a.catalogLocked(ctx)
	a.mu.Unlock()
	if err != nil {
		return nil, nil, err
	}
	var classes resourceapi.DeviceClassList
	if err := a.reader.List(ctx, &classes, client.UnsafeDisableDeepCopy); err != nil {
		return nil, nil, fmt.Errorf("listing DeviceClasses: %w", err)
	}
	return cat, &classes, nil
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
	cat, classes, err := a.catalogAndClasses(ctx)
	if err != nil {
		return nil, err
	}
	out := make(map[string][]string, len(classes.Items))
	for i := range classes.Items {
		dc := &classes.Items[i]
		var reached []string
		for name := range cat.pricer.RequestCost(ctx, classProbe(dc.Name)).Devices {
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
