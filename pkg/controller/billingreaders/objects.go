package billingreaders

import (
	"crypto/sha256"
	"encoding/hex"
	"slices"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/deviceclass"
)

const (
	// Label marks the ClusterRoles and ClusterRoleBindings of this
	// package: the controller caches only those, and the chart's policy
	// lets it write only those.
	Label = "gpuaas.io/billing-reader"
	// namePrefix starts both objects' name; the tenant's name follows.
	namePrefix = "gpuaas-billing-reader-"
	// maxName is the longest object name the API server takes.
	maxName = 253
)

// Name is the ClusterRole's and the ClusterRoleBinding's name for tenant:
// gpuaas-billing-reader-<tenant>, or, where that is too long, the tenant's
// name cut short and a hash of all of it, so that two long names that
// start alike still differ.
func Name(tenant string) string {
	if len(namePrefix)+len(tenant) <= maxName {
		return namePrefix + tenant
	}
	sum := sha256.Sum256([]byte(tenant))
	h := hex.EncodeToString(sum[:])[:16]
	return namePrefix + tenant[:maxName-len(namePrefix)-len(h)-1] + "-" + h
}

func ourLabels() map[string]string {
	return map[string]string{Label: "true", deviceclass.ManagedByLabel: deviceclass.ManagedByValue}
}

// ownerRef makes the quota the objects' controller, so the garbage
// collector removes them with it. Not blockOwnerDeletion: that needs
// update on the quota's finalizers, which the controller does not hold.
func ownerRef(q *gpuaas.TenantQuota) metav1.OwnerReference {
	return metav1.OwnerReference{APIVersion: gpuaas.GroupVersion.String(), Kind: gpuaas.TenantQuotaKind,
		Name: q.Name, UID: q.UID, Controller: ptr.To(true)}
}

// role grants get on the named TenantUsages only (sorted, so that the
// same names make the same object).
func role(q *gpuaas.TenantQuota, usages []string) *rbacv1.ClusterRole {
	names := slices.Clone(usages)
	slices.Sort(names)
	return &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: Name(q.Name), Labels: ourLabels(), OwnerReferences: []metav1.OwnerReference{ownerRef(q)}},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{gpuaas.GroupVersion.Group}, Resources: []string{"tenantusages"},
			Verbs: []string{"get"}, ResourceNames: slices.Compact(names)}},
	}
}

func binding(q *gpuaas.TenantQuota) *rbacv1.ClusterRoleBinding {
	return &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: Name(q.Name), Labels: ourLabels(), OwnerReferences: []metav1.OwnerReference{ownerRef(q)}},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: Name(q.Name)},
		Subjects:   subjects(q.Spec.Billing.Readers),
	}
}

// subjects are the readers with the API group the API server defaults to
// (rbac.authorization.k8s.io for users and groups): compared with the
// stored binding, an unset group is no difference to put back.
func subjects(readers []rbacv1.Subject) []rbacv1.Subject {
	out := slices.Clone(readers)
	for i := range out {
		if out[i].APIGroup == "" && (out[i].Kind == rbacv1.UserKind || out[i].Kind == rbacv1.GroupKind) {
			out[i].APIGroup = rbacv1.GroupName
		}
	}
	return out
}

func readers(q *gpuaas.TenantQuota) []rbacv1.Subject {
	if q.Spec.Billing == nil {
		return nil
	}
	return q.Spec.Billing.Readers
}
