package idle

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
)

// policy is the idle policy that applies to a claim, and where it came
// from ("tenantquota/a", "gpuprofile/b"), for the events.
type policy struct {
	gpuaas.IdlePolicy
	source string
	// tenant is the TenantQuota charged for the claim; empty when none
	// covers its namespace (a profile's policy still applies).
	tenant string
}

func (p *policy) warning() time.Duration {
	if p.Warning == nil {
		return 0
	}
	return p.Warning.Duration
}

// resolvePolicy is the policy for the claim's devices (ours), or nil and why
// none applies: the tenant's, overridden by the GpuProfile of each device's
// class; a device whose effective policy is None or absent exempts the whole
// claim (its pods hold that device too), and when devices' policies differ
// the most lenient (longest Duration and Warning) applies. A namespace the
// policy's ExemptNamespaceSelector matches (the Namespace object's labels,
// which are the cluster admin's) is exempt.
func resolvePolicy(ctx context.Context, c client.Reader, claim *resourceapi.ResourceClaim, ours []resourceapi.DeviceRequestAllocationResult) (*policy, string, error) {
	tenant, err := tenantOf(ctx, c, claim.Namespace)
	if err != nil {
		return nil, "", err
	}
	var chosen *policy
	for _, d := range ours {
		p, err := devicePolicy(ctx, c, claim, d, tenant)
		if err != nil {
			return nil, "", err
		}
		if p == nil {
			return nil, fmt.Sprintf("no idle policy applies to device %s/%s", d.Pool, d.Device), nil
		}
		if p.Action == gpuaas.IdleActionNone {
			return nil, fmt.Sprintf("device %s/%s is exempt by %s (action None)", d.Pool, d.Device, p.source), nil
		}
		if chosen == nil || lenient(p, chosen) {
			chosen = p
		}
	}
	if chosen == nil {
		return nil, "no device of ours", nil
	}
	exempt, err := namespaceExempt(ctx, c, claim.Namespace, chosen)
	if err != nil || exempt != "" {
		return nil, exempt, err
	}
	return chosen, "", nil
}

// lenient tells whether a gives the claim longer than b before acting.
func lenient(a, b *policy) bool {
	return a.Duration.Duration+a.warning() > b.Duration.Duration+b.warning()
}

// tenantOf is the TenantQuota whose resolved namespaces (status) hold ns;
// nil when none. Two quotas naming one namespace is a conflict the older
// one wins, as in the quota's own charging.
func tenantOf(ctx context.Context, c client.Reader, ns string) (*gpuaas.TenantQuota, error) {
	var list gpuaas.TenantQuotaList
	if err := c.List(ctx, &list); err != nil {
		return nil, fmt.Errorf("listing TenantQuotas: %w", err)
	}
	var out *gpuaas.TenantQuota
	for i := range list.Items {
		q := &list.Items[i]
		if !slices.Contains(q.Status.Namespaces, ns) {
			continue
		}
		if out == nil || q.CreationTimestamp.Before(&out.CreationTimestamp) {
			out = q
		}
	}
	return out, nil
}

// devicePolicy is the effective policy of one allocated device: its class's
// GpuProfile's, else the tenant's; nil when neither has one.
func devicePolicy(ctx context.Context, c client.Reader, claim *resourceapi.ResourceClaim, d resourceapi.DeviceRequestAllocationResult, tenant *gpuaas.TenantQuota) (*policy, error) {
	tenantName := ""
	if tenant != nil {
		tenantName = tenant.Name
	}
	// A GpuProfile renders the DeviceClass of its own name.
	if class := requestClass(claim, d.Request); class != "" {
		var p gpuaas.GpuProfile
		err := c.Get(ctx, types.NamespacedName{Name: class}, &p)
		switch {
		case err == nil && p.Spec.IdlePolicy != nil:
			return &policy{IdlePolicy: *p.Spec.IdlePolicy, source: "gpuprofile/" + p.Name, tenant: tenantName}, nil
		case err != nil && !apierrors.IsNotFound(err):
			return nil, fmt.Errorf("reading GpuProfile %s: %w", class, err)
		}
	}
	if tenant == nil || tenant.Spec.IdlePolicy == nil {
		return nil, nil
	}
	return &policy{IdlePolicy: *tenant.Spec.IdlePolicy, source: "tenantquota/" + tenant.Name, tenant: tenantName}, nil
}

// requestClass is the DeviceClass of the request an allocation result
// names: "request" or "request/subrequest" (firstAvailable).
func requestClass(claim *resourceapi.ResourceClaim, name string) string {
	main, sub, _ := strings.Cut(name, "/")
	for _, r := range claim.Spec.Devices.Requests {
		if r.Name != main {
			continue
		}
		if r.Exactly != nil && sub == "" {
			return r.Exactly.DeviceClassName
		}
		for _, s := range r.FirstAvailable {
			if s.Name == sub {
				return s.DeviceClassName
			}
		}
	}
	return ""
}

// namespaceExempt says why the policy's ExemptNamespaceSelector exempts the
// namespace, matched against the Namespace object's labels; "" when it
// does not. An unreadable selector exempts (the admin's mistake never
// evicts), and so does a namespace that cannot be found.
func namespaceExempt(ctx context.Context, c client.Reader, name string, p *policy) (string, error) {
	if p.ExemptNamespaceSelector == nil {
		return "", nil
	}
	sel, err := metav1.LabelSelectorAsSelector(p.ExemptNamespaceSelector)
	if err != nil {
		return fmt.Sprintf("the exemptNamespaceSelector of %s is invalid (%v): nothing is done until it is fixed", p.source, err), nil
	}
	var ns corev1.Namespace
	if err := c.Get(ctx, types.NamespacedName{Name: name}, &ns); err != nil {
		if apierrors.IsNotFound(err) {
			return "namespace " + name + " is gone", nil
		}
		return "", fmt.Errorf("reading namespace %s: %w", name, err)
	}
	if sel.Matches(labels.Set(ns.Labels)) {
		return fmt.Sprintf("namespace %s is exempt by the exemptNamespaceSelector of %s", name, p.source), nil
	}
	return "", nil
}

// thresholdText is the policy's threshold as the events say it.
func thresholdText(p *policy) string {
	return fmt.Sprintf("%d%%", p.ThresholdPercent)
}
