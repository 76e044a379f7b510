package admission

import (
	"context"
	"crypto/sha256"
	"fmt"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/quota"
)

// cachedCharge is a claim's charge as last priced, with what it was
// priced from, so that a later catalog generation may keep it.
type cachedCharge struct {
	resourceVersion string
	gen             int64
	charged         quota.Charged
	// pools and classes: for an allocated claim whose every device of ours
	// was published, the keys of its devices' pools and of the classes it
	// was priced with (priceList); nil pools: valid for gen only.
	pools   map[string]string
	classes string
}

// charge is what a claim of the cache is charged now, from the cache of
// charges when neither the claim nor the catalog changed since, else priced
// outside claimsMu (see priceClaim).
func (a *Accountant) charge(ctx context.Context, cat *priceList, claim *resourceapi.ResourceClaim) quota.Charged {
	a.claimsMu.Lock()
	c, ok := a.cachedChargeLocked(cat, claim)
	a.claimsMu.Unlock()
	if ok {
		return c
	}
	charged, complete := a.priceClaim(ctx, cat, claim)
	if complete {
		a.claimsMu.Lock()
		a.rememberChargeLocked(cat, claim, charged)
		a.claimsMu.Unlock()
	}
	return charged
}

// cachedChargeLocked is a claim's cached charge, if neither the claim nor
// the catalog changed since it was priced (caller holds claimsMu).
func (a *Accountant) cachedChargeLocked(cat *priceList, claim *resourceapi.ResourceClaim) (quota.Charged, bool) {
	c, ok := a.charges[claim.UID]
	if !ok || c.resourceVersion != claim.ResourceVersion {
		return quota.Charged{}, false
	}
	if c.gen == cat.gen {
		return c.charged, true
	}
	if c.pools == nil || c.classes != cat.classes {
		return quota.Charged{}, false
	}
	for pool, key := range c.pools {
		if cat.pools[pool] != key {
			return quota.Charged{}, false
		}
	}
	c.gen = cat.gen // valid for this generation too: carried over
	a.charges[claim.UID] = c
	return c.charged, true
}

// rememberChargeLocked caches a claim's complete charge (caller holds
// claimsMu).
func (a *Accountant) rememberChargeLocked(cat *priceList, claim *resourceapi.ResourceClaim, charged quota.Charged) {
	a.charges[claim.UID] = cachedCharge{resourceVersion: claim.ResourceVersion, gen: cat.gen, charged: charged,
		pools: portablePools(cat, claim), classes: cat.classes}
}

// portablePools are the keys of the pools an allocated claim's devices of
// ours are on, when every one of them is published (a missing device is
// charged its request's worst case over every pool); nil otherwise.
func portablePools(cat *priceList, claim *resourceapi.ResourceClaim) map[string]string {
	if claim.Status.Allocation == nil || cat.pools == nil {
		return nil
	}
	out := map[string]string{}
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != quota.DriverName {
			continue
		}
		key, ok := cat.pools[r.Pool]
		if !ok || cat.pricer.Inventory().Get(quota.DeviceID{Driver: r.Driver, Pool: r.Pool, Device: r.Device}) == nil {
			return nil
		}
		out[r.Pool] = key
	}
	return out
}

// poolKeys is, per pool of our driver, the names and resourceVersions of
// its slices: any change to a slice changes its key (a taint too, which
// then only costs a re-pricing).
func poolKeys(list []resourceapi.ResourceSlice) map[string]string {
	parts := map[string][]string{}
	for i := range list {
		s := &list[i]
		if s.Spec.Driver == quota.DriverName {
			parts[s.Spec.Pool.Name] = append(parts[s.Spec.Pool.Name], s.Name+"@"+s.ResourceVersion)
		}
	}
	out := make(map[string]string, len(parts))
	for pool, p := range parts {
		slices.Sort(p)
		out[pool] = strings.Join(p, ",")
	}
	return out
}

// classesKey is what of the classes, profiles and shapes a price reads:
// the classes' resourceVersions, the profiles' and shapes' generations,
// labels, annotations and deletion (not their status, which the
// reconcilers write after allocations).
func classesKey(classes []resourceapi.DeviceClass, profiles []gpuaas.GpuProfile, shapes []gpuaas.GpuShape, countShapes bool) string {
	h := sha256.New() // a hash's Write never fails
	_, _ = fmt.Fprintf(h, "shapes=%v;", countShapes)
	for i := range classes {
		_, _ = fmt.Fprintf(h, "c%q@%s;", classes[i].Name, classes[i].ResourceVersion)
	}
	for i := range profiles {
		p := &profiles[i]
		_, _ = fmt.Fprintf(h, "p%q@%d%v%v%v;", p.Name, p.Generation, p.Labels, p.Annotations, p.DeletionTimestamp.IsZero())
	}
	for i := range shapes {
		sh := &shapes[i]
		_, _ = fmt.Fprintf(h, "s%q@%d%v%v%v;", sh.Name, sh.Generation, sh.Labels, sh.Annotations, sh.DeletionTimestamp.IsZero())
	}
	return string(h.Sum(nil))
}

// priceClaim prices a claim of the cache within its CEL budget
// (quota.MaxCELCostPerClaim) and ctx's, which a recount's budget bounds
// (recountBudget). It holds no lock: claimsMu is shared by every cohort's
// decisions, and a tenant's claims of selectors near the API server's
// limit, each admitted within its budget, took seconds to price again
// after a catalog change, under claimsMu, while every other tenant's
// admission waited (issue 55).
//
// complete is false when ctx ended (a recount's budget spent, the caller's
// deadline) before the pricing did: the charge is then the worst case of
// what was not worked out (a whole GPU per device, the largest node for
// allocationMode All), and must not be remembered, or the claim would keep
// a price someone else's deadline chose. A claim that spent its own budget
// is complete: at its worst case too, but that is its price under this
// catalog, and pricing it again would only spend another budget.
func (a *Accountant) priceClaim(ctx context.Context, cat *priceList, claim *resourceapi.ResourceClaim) (_ quota.Charged, complete bool) {
	cctx, stop := quota.WithCELBudget(ctx, quota.MaxCELCostPerClaim)
	defer stop()
	if a.legacyRecount {
		cctx = ctx
	}
	if a.beforePricing != nil {
		a.beforePricing(cctx, claim)
	}
	charged := cat.pricer.Cost(cctx, claim)
	return charged, ctx.Err() == nil
}
