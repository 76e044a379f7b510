package admission

import "github.com/gpuaas/gpu-dra-driver/pkg/quota"

// SetPricingSlots has the accountant's pricers take their slots for new
// request shapes from s (quota.PricingSlots) instead of the accountant's
// own default set: each accountant bounds its own pricing, so tests and
// replicas in one process do not share the bound by accident. Call it
// before the accountant is used.
func (a *Accountant) SetPricingSlots(s *quota.PricingSlots) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.pricingSlots = s
	a.cat = nil // a pricer built already took the old set
}
