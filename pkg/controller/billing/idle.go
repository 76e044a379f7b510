package billing

import (
	"math/big"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
)

// idleHeld is what a tenant holds idle now: GPU units on devices whose
// Idle condition (written by the node's plugin from the use it measures,
// docs/usage.md) is True, and what they cost per hour at their records'
// prices. Integrated over time by Prometheus, it is the idle cost: held,
// billed and unused.
type idleHeld struct{ units, costPerHour *big.Rat }

func addIdle(into map[string]idleHeld, rec *gpuaas.UsageRecord) {
	h, ok := into[rec.Tenant]
	if !ok {
		h = idleHeld{units: new(big.Rat), costPerHour: new(big.Rat)}
	}
	u := ratOf(rec.Units)
	h.units.Add(h.units, u)
	h.costPerHour.Add(h.costPerHour, new(big.Rat).Mul(u, priceRat(rec.Price)))
	into[rec.Tenant] = h
}

// idleNow is a copy of what each tenant holds idle, for the collector.
func (r *Recorder) idleNow() map[string]idleHeld {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]idleHeld, len(r.idle))
	for tenant, h := range r.idle {
		out[tenant] = idleHeld{units: new(big.Rat).Set(h.units), costPerHour: new(big.Rat).Set(h.costPerHour)}
	}
	return out
}
