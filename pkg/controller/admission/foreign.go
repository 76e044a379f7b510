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
