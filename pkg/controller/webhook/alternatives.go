package webhook

import (
	"context"
	"slices"
	"strings"

	"gomodules.xyz/jsonpatch/v2"
	admissionv1 "k8s.io/api/admission/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	quotaadmission "github.com/gpuaas/gpu-dra-driver/pkg/controller/admission"
	"github.com/gpuaas/gpu-dra-driver/pkg/quota"
)

// A firstAvailable request is charged for its most expensive alternative
// (the scheduler may pick any that has a free device), so a claim listing
// first a profile its tenant may not have, then one it may, was always
// denied. The alternatives webhook, a mutating webhook that runs before
// the quota webhook, drops from a new claim's firstAvailable requests the
// alternatives its tenant could not be admitted for now, each judged alone
// as if it were the whole claim, and the names of the dropped ones from
// the claim's constraints and configs. The quota webhook then charges the
// claim for what is left, as before, and stays the one that decides: the
// trimming only widens what it can admit.
//
// It keeps every alternative when none would fit (the quota webhook denies
// the claim and tells why, and the claim keeps its shape for the retry).
// The claims of Kueue's workloads are trimmed like any other: Kueue charges
// no firstAvailable request (it refuses such workloads), so the quota
// webhook never admits them past quota for Kueue. It fails open
// (failurePolicy Ignore): untrimmed, a claim is only charged more, never
// less.
//
// "Now" is the price of the trimming: an alternative dropped because its
// tenant's quota was full at the claim's creation is not offered again
// when the quota frees. The scheduler allocates a claim once, soon after
// its creation, so that is when its alternatives matter.

// trimmedWarning is the prefix of the warning on a trimmed claim.
const trimmedWarning = "firstAvailable alternatives dropped because the tenant's quota does not admit them now"

// alternativesCondition sends a claim to the alternatives webhook only
// when one of its requests has alternatives to drop. The apiserver hands
// match conditions the object without its schema, hence the checks.
// One line, as the chart renders it.
const alternativesCondition = `has(object.spec) && has(object.spec.devices) && has(object.spec.devices.requests) && ` +
	`type(object.spec.devices.requests) == list && object.spec.devices.requests.exists(r, type(r) == map && ` +
	`has(r.firstAvailable) && type(r.firstAvailable) == list && size(r.firstAvailable) > 1)`

// alternativesConditionName names the condition.
const alternativesConditionName = "gpuaas.io/has-alternatives"

// alternativesWebhook trims new claims' firstAvailable requests.
type alternativesWebhook struct {
	exempt  sets.Set[string]
	acct    *quotaadmission.Accountant
	decoder admission.Decoder
}

func (h *alternativesWebhook) Handle(ctx context.Context, req admission.Request) admission.Response {
	if req.Operation != admissionv1.Create || h.exempt.Has(req.Namespace) {
		return admission.Allowed("")
	}
	// Never an error response: failurePolicy covers only failed calls,
	// and a refusal here would refuse the claim. The quota webhook judges
	// whatever this one lets through.
	logger := klog.FromContext(ctx).WithValues("claim", klog.KRef(req.Namespace, req.Name))
	var claim resourceapi.ResourceClaim
	if err := h.decoder.Decode(req, &claim); err != nil {
		logger.Error(err, "Decoding the ResourceClaim failed; left as it is")
		return admission.Allowed("")
	}
	claim.Namespace = req.Namespace
	if !hasAlternatives(&claim.Spec) {
		return admission.Allowed("")
	}
	if ptr.Deref(req.DryRun, false) {
		// Priced in the dry runs' own slots and not remembered, as the
		// claim webhook prices a dry run (issue 55 route 4).
		ctx = quota.WithDryRun(ctx)
	}
	reasons, tenant, err := h.unfit(ctx, &claim)
	if err != nil {
		logger.Error(err, "Judging firstAvailable alternatives failed; the claim keeps them all")
		return admission.Allowed("")
	}
	if len(reasons) == 0 {
		return admission.Allowed("")
	}
	dropped := trimAlternatives(&claim.Spec, func(req string, sub *resourceapi.DeviceSubRequest) bool {
		_, ok := reasons[req+"/"+sub.Name]
		return ok
	})
	if len(dropped) == 0 {
		return admission.Allowed("")
	}
	why := make([]string, len(dropped))
	for i, name := range dropped {
		why[i] = name + ": " + reasons[name]
	}
	logger.V(2).Info("Dropped firstAvailable alternatives over quota", "tenant", tenant, "dropped", dropped)
	if !ptr.Deref(req.DryRun, false) {
		alternativesDropped.WithLabelValues(tenant).Add(float64(len(dropped)))
	}
	patch := jsonpatch.JsonPatchOperation{Operation: "replace", Path: "/spec/devices", Value: claim.Spec.Devices}
	return admission.Patched("", patch).WithWarnings(trimmedWarning + ": " + strings.Join(why, "; "))
}

// hasAlternatives tells whether some request has more than one
// alternative: only then is there something to drop.
func hasAlternatives(spec *resourceapi.ResourceClaimSpec) bool {
	return slices.ContainsFunc(spec.Devices.Requests, func(r resourceapi.DeviceRequest) bool {
		return len(r.FirstAvailable) > 1
	})
}

// unfit judges every alternative of the claim's firstAvailable requests as
// a claim of its own (a dry run: nothing is reserved) and returns why each
// one that would be denied is, by "request/alternative", and the tenant
// that denies them. All of them are priced within one claim's CEL budget
// (each Admit's budget spends from it too): one budget each let a claim of
// eight alternatives spend eight claims' worth; those priced after it is
// spent are refused as too costly to evaluate, and dropped.
func (h *alternativesWebhook) unfit(ctx context.Context, claim *resourceapi.ResourceClaim) (map[string]string, string, error) {
	ctx, stop := quota.WithCELBudget(ctx, quota.MaxCELCostPerClaim)
	defer stop()
	out := map[string]string{}
	tenant := ""
	for _, r := range claim.Spec.Devices.Requests {
		if len(r.FirstAvailable) < 2 {
			continue
		}
		for i := range r.FirstAvailable {
			adm, err := h.acct.Admit(ctx, alone(claim, r.Name, &r.FirstAvailable[i]), true)
			if err != nil {
				return nil, "", err
			}
			if !adm.Allowed {
				out[r.Name+"/"+r.FirstAvailable[i].Name], tenant = adm.Reason, adm.Tenant
			}
		}
	}
	return out, tenant, nil
}

// alone is the claim that asks for one alternative of a request and
// nothing else.
func alone(claim *resourceapi.ResourceClaim, request string, sub *resourceapi.DeviceSubRequest) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{ObjectMeta: *claim.ObjectMeta.DeepCopy()}
	c.Spec.Devices.Requests = []resourceapi.DeviceRequest{{Name: request, Exactly: &resourceapi.ExactDeviceRequest{
		DeviceClassName: sub.DeviceClassName,
		Selectors:       sub.Selectors,
		AllocationMode:  sub.AllocationMode,
		Count:           sub.Count,
		Capacity:        sub.Capacity,
		Tolerations:     sub.Tolerations,
	}}}
	return c
}

// trimAlternatives removes the firstAvailable alternatives drop names,
// never a request's last one, and returns the removed ones as
// "request/alternative". Constraints and configs lose the names of removed
// alternatives (the apiserver refuses a reference to a subrequest that
// does not exist); one left naming nothing is removed, since an empty list
// would apply it to every request.
func trimAlternatives(spec *resourceapi.ResourceClaimSpec, drop func(request string, sub *resourceapi.DeviceSubRequest) bool) []string {
	var dropped []string
	for i := range spec.Devices.Requests {
		r := &spec.Devices.Requests[i]
		if len(r.FirstAvailable) < 2 {
			continue
		}
		var kept []resourceapi.DeviceSubRequest
		var gone []string
		for j := range r.FirstAvailable {
			if drop(r.Name, &r.FirstAvailable[j]) {
				gone = append(gone, r.Name+"/"+r.FirstAvailable[j].Name)
			} else {
				kept = append(kept, r.FirstAvailable[j])
			}
		}
		if len(kept) == 0 || len(gone) == 0 {
			continue
		}
		r.FirstAvailable = kept
		dropped = append(dropped, gone...)
	}
	if len(dropped) == 0 {
		return nil
	}
	removed := sets.New(dropped...)
	spec.Devices.Constraints = withoutNames(spec.Devices.Constraints,
		func(c *resourceapi.DeviceConstraint) *[]string { return &c.Requests }, removed)
	spec.Devices.Config = withoutNames(spec.Devices.Config,
		func(c *resourceapi.DeviceClaimConfiguration) *[]string { return &c.Requests }, removed)
	return dropped
}

// withoutNames removes the removed names from the request lists of
// constraints or configs, and the entries that named only removed ones.
func withoutNames[T any](entries []T, names func(*T) *[]string, removed sets.Set[string]) []T {
	out := entries[:0]
	for i := range entries {
		list := names(&entries[i])
		if len(*list) == 0 { // applies to every request, whichever alternatives are left
			out = append(out, entries[i])
			continue
		}
		*list = slices.DeleteFunc(*list, removed.Has)
		if len(*list) > 0 {
			out = append(out, entries[i])
		}
	}
	return out
}
