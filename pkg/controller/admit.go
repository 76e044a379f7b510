package controller

import (
	"context"
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpuaas/gpu-dra-driver/pkg/quota"
)

// Admission is the outcome of charging a new claim.
type Admission struct {
	quota.Decision
	// Tenant is the TenantQuota charged ("" when none covers the namespace).
	Tenant string
	// Cohort of the tenant, for the warning on a borrowing claim.
	Cohort string
	// Cost is the claim's worst case.
	Cost quota.Charge
}

// Admit decides on a claim being created. Decisions are serialized: two
// claims arriving together cannot both take the last unit. An admitted
// claim that costs anything is reserved until the informer cache shows it
// (unless dryRun), even when no quota covers its namespace yet: a quota
// created a moment ago must still see it.
func (a *Accountant) Admit(ctx context.Context, claim *resourceapi.ResourceClaim, dryRun bool) (Admission, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	adm, err := a.decideLocked(ctx, claim)
	if err != nil {
		return adm, err
	}
	if adm.Allowed && !dryRun && !adm.Cost.IsZero() {
		key := types.NamespacedName{Namespace: claim.Namespace, Name: claim.Name}
		a.pending[key] = pendingClaim{uid: claim.UID, charge: adm.Cost, expires: a.now().Add(pendingTTL)}
	}
	return adm, nil
}

func (a *Accountant) decideLocked(ctx context.Context, claim *resourceapi.ResourceClaim) (Admission, error) {
	cat, err := a.catalogLocked(ctx)
	if err != nil {
		return Admission{}, err
	}
	ten, err := a.tenancyLocked(ctx)
	if err != nil {
		return Admission{}, err
	}
	owner, err := a.ownerLocked(ctx, ten, claim.Namespace)
	if err != nil {
		return Admission{}, err
	}
	adm := Admission{Tenant: owner, Cost: cat.pricer.ClaimCost(ctx, &claim.Spec), Decision: quota.Decision{Allowed: true}}
	switch {
	case adm.Cost.IsZero():
		return adm, nil
	case owner == "":
		if a.DenyUnassigned {
			adm.Allowed, adm.Resource = false, "tenant"
			adm.Reason = fmt.Sprintf("namespace %s belongs to no TenantQuota, and GPUs are only for tenants", claim.Namespace)
		}
		return adm, nil
	case ten.invalid[owner] != "":
		adm.Allowed, adm.Resource = false, "tenant"
		adm.Reason = fmt.Sprintf("TenantQuota %q is invalid and refuses every claim until it is fixed: %s", owner, ten.invalid[owner])
		return adm, nil
	}
	tenant := ten.tenants[owner]
	adm.Cohort = tenant.Cohort
	usage, err := a.usageLocked(ctx, cat, ten, owner)
	if err != nil {
		return adm, err
	}
	peers, err := a.peersLocked(ctx, cat, ten, tenant)
	if err != nil {
		return adm, err
	}
	adm.Decision = quota.Decide(tenant, usage, adm.Cost, peers)
	return adm, nil
}

// TenantReport is what the quota reconciler writes to a TenantQuota's
// status.
type TenantReport struct {
	Tenant     quota.Tenant
	Namespaces []string
	Conflicts  []string
	Invalid    string
	Usage      quota.Usage
	Peers      []quota.Peer
}

// Report computes a tenant's status from the cache.
func (a *Accountant) Report(ctx context.Context, name string) (TenantReport, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	cat, err := a.catalogLocked(ctx)
	if err != nil {
		return TenantReport{}, err
	}
	ten, err := a.tenancyLocked(ctx)
	if err != nil {
		return TenantReport{}, err
	}
	r := TenantReport{
		Tenant:     ten.tenants[name],
		Namespaces: ten.assign.Namespaces[name],
		Conflicts:  ten.assign.Conflicts[name],
		Invalid:    ten.invalid[name],
	}
	if r.Usage, err = a.usageLocked(ctx, cat, ten, name); err != nil {
		return r, err
	}
	r.Peers, err = a.peersLocked(ctx, cat, ten, r.Tenant)
	return r, err
}

// ProfileReport is what the profile reconciler writes to a GpuProfile's
// status.
type ProfileReport struct {
	Matching, Allocated int
}

// ProfileDevices counts the published devices a class selects and how many
// of them some claim holds.
func (a *Accountant) ProfileDevices(ctx context.Context, exprs []string) (ProfileReport, error) {
	a.mu.Lock()
	cat, err := a.catalogLocked(ctx)
	a.mu.Unlock()
	if err != nil {
		return ProfileReport{}, err
	}
	allocated, err := a.allocatedDevices(ctx)
	if err != nil {
		return ProfileReport{}, err
	}
	var r ProfileReport
	for _, d := range cat.pricer.Inventory().Devices() {
		if quota.Matches(ctx, d, exprs) {
			r.Matching++
			if allocated[d.ID] {
				r.Allocated++
			}
		}
	}
	return r, nil
}

func (a *Accountant) allocatedDevices(ctx context.Context) (map[quota.DeviceID]bool, error) {
	var claims resourceapi.ResourceClaimList
	if err := a.reader.List(ctx, &claims, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("listing ResourceClaims: %w", err)
	}
	out := map[quota.DeviceID]bool{}
	for _, c := range claims.Items {
		if c.Status.Allocation == nil {
			continue
		}
		for _, r := range c.Status.Allocation.Devices.Results {
			if r.Driver == quota.DriverName {
				out[quota.DeviceID{Driver: r.Driver, Pool: r.Pool, Device: r.Device}] = true
			}
		}
	}
	return out, nil
}

// PublishedMigProfiles are the MIG profile names nodes publish.
func (a *Accountant) PublishedMigProfiles(ctx context.Context) (map[string]bool, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	cat, err := a.catalogLocked(ctx)
	if err != nil {
		return nil, err
	}
	return cat.migs, nil
}

// NamespaceOwner is the quota a namespace is charged to ("" if none).
func (a *Accountant) NamespaceOwner(ctx context.Context, namespace string) (string, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	ten, err := a.tenancyLocked(ctx)
	if err != nil {
		return "", err
	}
	return a.ownerLocked(ctx, ten, namespace)
}

// heldByOthers lists which of a TenantQuota's namespaces another quota
// already holds, for the warning when the quota is created or changed.
func (a *Accountant) heldByOthers(ctx context.Context, name string, namespaces []string) ([]string, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	ten, err := a.tenancyLocked(ctx)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, ns := range namespaces {
		if q, ok := ten.owner[ns]; ok && q != name {
			out = append(out, fmt.Sprintf("namespace %s is already charged to TenantQuota %q", ns, q))
		}
	}
	return out, nil
}
