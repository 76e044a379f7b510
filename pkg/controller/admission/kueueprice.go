package admission

import (
	"context"

	"github.com/gpuaas/gpu-dra-driver/pkg/kueue"
	"github.com/gpuaas/gpu-dra-driver/pkg/quota"
)

// MaxMilliunits is the largest gpu-milliunits counter among the published
// devices of ours that the selectors match: what Kueue's counter source
// charges a claim template of the class, and so what a pod asking the
// class's extended resource is charged through Kueue's transformations
// (kueuemirror). False while no matching device consumes the counter.
func (a *Accountant) MaxMilliunits(ctx context.Context, selectors []string) (int64, bool, error) {
	a.mu.Lock()
	cat, err := a.catalogLocked(ctx)
	a.mu.Unlock()
	if err != nil {
		return 0, false, err
	}
	var most int64
	found := false
	for _, d := range cat.pricer.Inventory().Devices() {
		if !quota.Matches(ctx, d, selectors) {
			continue
		}
		if m, ok := kueue.DeviceMilliunits(&d.Basic); ok && (!found || m > most) {
			most, found = m, true
		}
	}
	return most, found, nil
}
