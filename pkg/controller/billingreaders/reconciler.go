package billingreaders

import (
	"context"
	"fmt"
	"maps"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller/billing"
)

// Reconciler keeps one TenantQuota's reader ClusterRole and binding.
type Reconciler struct {
	Client client.Client
	// Now is the clock the current month is read from.
	Now func() time.Time
}

// Reconcile brings the role and binding of the quota req names to what its
// spec.billing.readers says, and comes back when the month ends, so that
// the new month's TenantUsage is readable from its first second.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	log := klog.FromContext(ctx).WithValues("tenantQuota", req.Name)
	ctx = klog.NewContext(ctx, log)
	var q gpuaas.TenantQuota
	if err := r.Client.Get(ctx, req.NamespacedName, &q); err != nil {
		// Gone: the garbage collector removes what it owned.
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !q.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, nil
	}
	if len(readers(&q)) == 0 {
		return ctrl.Result{}, r.remove(ctx, Name(q.Name))
	}
	now := r.Now()
	usages, err := r.usageNames(ctx, q.Name, now)
	if err != nil {
		return ctrl.Result{}, err
	}
	if err := r.keepRole(ctx, role(&q, usages)); err != nil {
		return ctrl.Result{}, err
	}
	if err := r.keepBinding(ctx, binding(&q)); err != nil {
		return ctrl.Result{}, err
	}
	_, _, end := billing.Period(now)
	return ctrl.Result{RequeueAfter: end.Sub(now) + time.Second}, nil
}

// usageNames are the names of the tenant's TenantUsages and of the current
// month's, which the recorder creates when the tenant's first claim of the
// month is allocated.
func (r *Reconciler) usageNames(ctx context.Context, tenant string, now time.Time) ([]string, error) {
	var list gpuaas.TenantUsageList
	if err := r.Client.List(ctx, &list); err != nil {
		return nil, fmt.Errorf("listing TenantUsages: %w", err)
	}
	period, _, _ := billing.Period(now)
	names := []string{billing.UsageName(tenant, period)}
	for _, u := range list.Items {
		// By the spec, not the name: tenant a's names are a prefix of
		// tenant a-b's.
		if u.Spec.Tenant == tenant && u.Name == billing.UsageName(tenant, u.Spec.Period) {
			names = append(names, u.Name)
		}
	}
	return names, nil
}

// ours says whether obj carries our label; an object of our name without
// it is someone else's, left alone.
func ours(obj client.Object) error {
	if obj.GetLabels()[Label] != "true" {
		return fmt.Errorf("%T %s exists without the label %s=true: not the controller's, left alone", obj, obj.GetName(), Label)
	}
	return nil
}

func (r *Reconciler) keepRole(ctx context.Context, want *rbacv1.ClusterRole) error {
	var have rbacv1.ClusterRole
	err := r.Client.Get(ctx, client.ObjectKeyFromObject(want), &have)
	if apierrors.IsNotFound(err) {
		klog.FromContext(ctx).V(2).Info("Creating the billing readers' ClusterRole", "name", want.Name)
		return wrap(r.Client.Create(ctx, want), "creating ClusterRole", want.Name)
	}
	if err != nil {
		return wrap(err, "reading ClusterRole", want.Name)
	}
	if err := ours(&have); err != nil {
		return err
	}
	if equality.Semantic.DeepEqual(have.Rules, want.Rules) && metaAsWanted(&have, want) && have.AggregationRule == nil {
		return nil
	}
	have.Rules, have.AggregationRule, have.OwnerReferences = want.Rules, nil, want.OwnerReferences
	maps.Copy(have.Labels, want.Labels)
	klog.FromContext(ctx).V(2).Info("Updating the billing readers' ClusterRole", "name", want.Name, "usages", want.Rules[0].ResourceNames)
	return wrap(r.Client.Update(ctx, &have), "updating ClusterRole", want.Name)
}

func (r *Reconciler) keepBinding(ctx context.Context, want *rbacv1.ClusterRoleBinding) error {
	var have rbacv1.ClusterRoleBinding
	err := r.Client.Get(ctx, client.ObjectKeyFromObject(want), &have)
	if err == nil && have.RoleRef != want.RoleRef && ours(&have) == nil {
		// roleRef cannot change: the binding is made again.
		if err := r.Client.Delete(ctx, &have); client.IgnoreNotFound(err) != nil {
			return wrap(err, "deleting ClusterRoleBinding", want.Name)
		}
		err = apierrors.NewNotFound(rbacv1.Resource("clusterrolebindings"), want.Name)
	}
	if apierrors.IsNotFound(err) {
		klog.FromContext(ctx).V(2).Info("Creating the billing readers' ClusterRoleBinding", "name", want.Name)
		return wrap(r.Client.Create(ctx, want), "creating ClusterRoleBinding", want.Name)
	}
	if err != nil {
		return wrap(err, "reading ClusterRoleBinding", want.Name)
	}
	if err := ours(&have); err != nil {
		return err
	}
	if equality.Semantic.DeepEqual(have.Subjects, want.Subjects) && metaAsWanted(&have, want) {
		return nil
	}
	have.Subjects, have.OwnerReferences = want.Subjects, want.OwnerReferences
	maps.Copy(have.Labels, want.Labels)
	return wrap(r.Client.Update(ctx, &have), "updating ClusterRoleBinding", want.Name)
}

// metaAsWanted: our labels set and the quota the one owner.
func metaAsWanted(have, want client.Object) bool {
	for k, v := range want.GetLabels() {
		if have.GetLabels()[k] != v {
			return false
		}
	}
	return equality.Semantic.DeepEqual(have.GetOwnerReferences(), want.GetOwnerReferences())
}

// remove deletes the binding and then the role, where they are ours.
func (r *Reconciler) remove(ctx context.Context, name string) error {
	for _, obj := range []client.Object{&rbacv1.ClusterRoleBinding{}, &rbacv1.ClusterRole{}} {
		if err := r.Client.Get(ctx, client.ObjectKey{Name: name}, obj); err != nil {
			if apierrors.IsNotFound(err) {
				continue
			}
			return wrap(err, fmt.Sprintf("reading %T", obj), name)
		}
		if ours(obj) != nil {
			continue
		}
		klog.FromContext(ctx).V(2).Info("Deleting the billing readers' object: the quota lists none", "kind", fmt.Sprintf("%T", obj), "name", name)
		if err := r.Client.Delete(ctx, obj); client.IgnoreNotFound(err) != nil {
			return wrap(err, fmt.Sprintf("deleting %T", obj), name)
		}
	}
	return nil
}

func wrap(err error, what, name string) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s %s: %w", what, name, err)
}
