package quota

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
)

// SortByAge orders quotas oldest first (then by name): the order in which
// they win namespaces claimed by more than one.
func SortByAge(quotas []*gpuaas.TenantQuota) {
	slices.SortFunc(quotas, func(a, b *gpuaas.TenantQuota) int {
		if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
}

// Resolve is Assign over lists as the API returns them: the quotas,
// oldest first (SortByAge, the order Owner and Assign take), and which
// namespaces each is charged for.
func Resolve(quotas []gpuaas.TenantQuota, namespaces []corev1.Namespace) ([]*gpuaas.TenantQuota, Assignment) {
	sorted := make([]*gpuaas.TenantQuota, 0, len(quotas))
	for i := range quotas {
		sorted = append(sorted, &quotas[i])
	}
	SortByAge(sorted)
	nss := make([]*corev1.Namespace, 0, len(namespaces))
	for i := range namespaces {
		nss = append(nss, &namespaces[i])
	}
	return sorted, Assign(sorted, nss)
}

// ClaimsNamespace reports whether q names the namespace or selects it by
// its labels. A selector that does not parse selects nothing (the quota is
// flagged invalid).
func ClaimsNamespace(q *gpuaas.TenantQuota, ns string, nsLabels map[string]string) bool {
	if q.Claims(ns) {
		return true
	}
	if q.Spec.NamespaceSelector == nil {
		return false
	}
	sel, err := metav1.LabelSelectorAsSelector(q.Spec.NamespaceSelector)
	if err != nil {
		return false
	}
	return sel.Matches(labels.Set(nsLabels))
}

// Owner is the quota a namespace is charged to: of the quotas (sorted with
// SortByAge) that claim it, the oldest. The others are returned too, for the
// NamespaceConflict condition.
func Owner(quotas []*gpuaas.TenantQuota, ns string, nsLabels map[string]string) (owner *gpuaas.TenantQuota, others []*gpuaas.TenantQuota) {
	for _, q := range quotas {
		if !ClaimsNamespace(q, ns, nsLabels) {
			continue
		}
		if owner == nil {
			owner = q
		} else {
			others = append(others, q)
		}
	}
	return owner, others
}

// Assignment is which namespaces each quota is charged for, and which it
// claims but lost to an older quota.
type Assignment struct {
	// Namespaces per quota name, sorted.
	Namespaces map[string][]string
	// Conflicts per quota name: one line per contested namespace.
	Conflicts map[string][]string
}

// Assign resolves every quota's namespaces (quotas sorted with SortByAge).
// Namespaces a quota names that do not exist yet are assigned too, so a
// claim in a namespace created later is charged at once.
func Assign(quotas []*gpuaas.TenantQuota, namespaces []*corev1.Namespace) Assignment {
	a := Assignment{Namespaces: map[string][]string{}, Conflicts: map[string][]string{}}
	known := map[string]map[string]string{}
	for _, ns := range namespaces {
		known[ns.Name] = ns.Labels
	}
	for _, q := range quotas {
		for _, ns := range q.Spec.Namespaces {
			if _, ok := known[ns]; !ok {
				known[ns] = nil
			}
		}
	}
	for _, ns := range slices.Sorted(maps.Keys(known)) {
		owner, others := Owner(quotas, ns, known[ns])
		if owner == nil {
			continue
		}
		a.Namespaces[owner.Name] = append(a.Namespaces[owner.Name], ns)
		for _, o := range others {
			a.Conflicts[o.Name] = append(a.Conflicts[o.Name],
				fmt.Sprintf("namespace %s is charged to the older TenantQuota %q", ns, owner.Name))
			a.Conflicts[owner.Name] = append(a.Conflicts[owner.Name],
				fmt.Sprintf("namespace %s is also claimed by TenantQuota %q", ns, o.Name))
		}
	}
	return a
}
