package controller

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller/admission"
	"github.com/gpuaas/gpu-dra-driver/pkg/quota"
)

// The backstop: for what Kubernetes can count itself, the API server's own
// ResourceQuota admission enforces a TenantQuota's device limits too, so
// that a bug in the quota webhook, or a webhook configuration someone
// deleted, cannot give a tenant more whole devices of a profile than its
// limit. ResourceQuota counts per namespace the devices each claim
// requests per DeviceClass (`<class>.deviceclass.resource.k8s.io/devices`;
// allocationMode All as 32, a firstAvailable request as its largest
// alternative), so each namespace of a tenant gets the tenant's device
// limits: a tenant of one namespace is held exactly, one of n namespaces to
// n times its limit. gpuUnits, gpuMemory and cohorts are beyond it: only
// the webhook enforces those (docs).
const (
	backstopName        = "gpuaas-backstop"
	backstopTenantLabel = "gpuaas.io/tenant-quota"
	managedByLabel      = "app.kubernetes.io/managed-by"
	managedByController = "gpuaas-dra-controller"
)

// backstopKey is the one request the backstop reconciles: a namespace can
// move between quotas, so every change re-derives them all.
var backstopKey = reconcile.Request{NamespacedName: types.NamespacedName{Name: "all"}}

// backstopReconciler keeps one ResourceQuota per namespace of a TenantQuota
// with device limits (the leader only).
type backstopReconciler struct {
	client client.Client
	// skipKueue leaves out tenants Kueue admits for (spec.kueue set, with
	// --kueue): their admitted workloads may go past device limits.
	skipKueue bool
	// reached maps each DeviceClass to the GpuProfiles whose devices it
	// can hand out (Accountant.ProfilesReached); nil: the limits' own
	// classes only. invalidate drops the snapshot it works from, before a
	// class, slice or profile event enqueues a reconcile, so that the
	// reconcile never works from the snapshot before the event.
	reached    func(context.Context) (map[string][]string, error)
	invalidate func()
}

func (r *backstopReconciler) setup(mgr ctrl.Manager) error {
	all := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
		return []reconcile.Request{backstopKey}
	})
	devicesChanged := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
		if r.invalidate != nil {
			r.invalidate()
		}
		return []reconcile.Request{backstopKey}
	})
	ours := predicate.NewPredicateFuncs(func(o client.Object) bool {
		return o.GetLabels()[managedByLabel] == managedByController && o.GetName() == backstopName
	})
	return ctrl.NewControllerManagedBy(mgr).Named("quota-backstop").
		Watches(&gpuaas.TenantQuota{}, all, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&corev1.Namespace{}, all, builder.WithPredicates(predicate.LabelChangedPredicate{})).
		Watches(&corev1.ResourceQuota{}, all, builder.WithPredicates(ours)).
		// What each class reaches changes with the classes, the published
		// devices and the profiles.
		Watches(&resourceapi.DeviceClass{}, devicesChanged, builder.WithPredicates(reachChanged(&resourceapi.DeviceClass{}))).
		Watches(&resourceapi.ResourceSlice{}, devicesChanged, builder.WithPredicates(reachChanged(&resourceapi.ResourceSlice{}))).
		Watches(&gpuaas.GpuProfile{}, devicesChanged, builder.WithPredicates(reachChanged(&gpuaas.GpuProfile{}))).
		Complete(r)
}

// reachChanged passes the events of obj's kind that can change what a
// class reaches: the pricer says (ProfilesReached), so those that move a
// price. A health taint, another driver's slice or a GpuProfile's status
// write does not, and each invalidated the catalog here, so the next
// admission re-priced every claim of its cohort.
func reachChanged(obj client.Object) predicate.Predicate {
	return admission.PricesMoved(obj)
}

func (r *backstopReconciler) Reconcile(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
	want, err := r.desired(ctx)
	if err != nil {
		return reconcile.Result{}, err
	}
	var have corev1.ResourceQuotaList
	if err := r.client.List(ctx, &have, client.MatchingLabels{managedByLabel: managedByController}); err != nil {
		return reconcile.Result{}, fmt.Errorf("listing backstop ResourceQuotas: %w", err)
	}
	var errs []error
	for i := range have.Items {
		q := &have.Items[i]
		if q.Name != backstopName {
			continue
		}
		w, ok := want[q.Namespace]
		delete(want, q.Namespace)
		errs = append(errs, r.converge(ctx, q, w, ok))
	}
	for _, ns := range slices.Sorted(maps.Keys(want)) {
		errs = append(errs, r.create(ctx, want[ns]))
	}
	return reconcile.Result{}, errors.Join(errs...)
}

// desired is the backstop of every namespace whose tenant has device limits.
func (r *backstopReconciler) desired(ctx context.Context) (map[string]*corev1.ResourceQuota, error) {
	// Resolved here, not taken from the accountant: its snapshot is
	// invalidated by another handler of the same event, maybe after this
	// reconcile ran.
	var quotas gpuaas.TenantQuotaList
	if err := r.client.List(ctx, &quotas); err != nil {
		return nil, fmt.Errorf("listing TenantQuotas: %w", err)
	}
	var nsList corev1.NamespaceList
	if err := r.client.List(ctx, &nsList); err != nil {
		return nil, fmt.Errorf("listing Namespaces: %w", err)
	}
	sorted, assign := quota.Resolve(quotas.Items, nsList.Items) // the older quota keeps a namespace two select
	var reached map[string][]string
	if r.reached != nil {
		var err error
		if reached, err = r.reached(ctx); err != nil {
			return nil, err
		}
	}
	want := map[string]*corev1.ResourceQuota{}
	for _, q := range sorted {
		if invalid := len(q.Validate()) > 0; invalid || len(q.Spec.Limits.Devices) == 0 || (r.skipKueue && q.Spec.Kueue != nil) {
			continue
		}
		hard := corev1.ResourceList{}
		for class, n := range classLines(q.Spec.Limits.Devices, reached) {
			hard[corev1.ResourceName(class+".deviceclass.resource.k8s.io/devices")] = *resource.NewQuantity(n, resource.DecimalSI)
		}
		for _, ns := range assign.Namespaces[q.Name] {
			want[ns] = &corev1.ResourceQuota{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: backstopName,
					Labels: map[string]string{managedByLabel: managedByController, backstopTenantLabel: q.Name}},
				Spec: corev1.ResourceQuotaSpec{Hard: hard},
			}
		}
	}
	return want, nil
}

// classLines are a tenant's backstop lines, per DeviceClass: each device
// limit as it is, and every other class that reaches the devices of a
// limited profile at the sum of the limits it reaches (a catch-all class
// reaching h100: 2 and a100: 3 gets 5). The sum, not the least, because the
// webhook charges each device to every profile it belongs to, so what the
// webhook admits through such a class never exceeds the sum, and the
// backstop must not refuse what the webhook admits; a class that also
// reaches devices of no limited profile is held to the sum too, which the
// admin lifts by naming the class in the limits (that line is then taken
// as written). With the webhook gone, a profile's devices per namespace are
// held to the sum of the lines of the classes reaching them.
func classLines(limits map[string]int64, reached map[string][]string) map[string]int64 {
	lines := maps.Clone(limits)
	if lines == nil {
		lines = map[string]int64{}
	}
	for class, profiles := range reached {
		if _, named := limits[class]; named {
			continue
		}
		var sum int64
		limited := false
		for _, p := range profiles {
			if n, ok := limits[p]; ok {
				sum, limited = sum+n, true
			}
		}
		if limited {
			lines[class] = sum
		}
	}
	return lines
}

// converge updates q to w, or deletes it when its namespace needs none.
func (r *backstopReconciler) converge(ctx context.Context, q, w *corev1.ResourceQuota, wanted bool) error {
	if !wanted {
		if err := r.client.Delete(ctx, q); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("deleting backstop ResourceQuota of namespace %s: %w", q.Namespace, err)
		}
		klog.FromContext(ctx).V(2).Info("Deleted backstop ResourceQuota", "resourceQuota", klog.KObj(q))
		return nil
	}
	if equality.Semantic.DeepEqual(q.Spec.Hard, w.Spec.Hard) && maps.Equal(q.Labels, w.Labels) {
		return nil
	}
	q = q.DeepCopy()
	q.Spec.Hard, q.Labels = w.Spec.Hard, w.Labels
	if err := r.client.Update(ctx, q); err != nil {
		return fmt.Errorf("updating backstop ResourceQuota of namespace %s: %w", q.Namespace, err)
	}
	klog.FromContext(ctx).V(2).Info("Updated backstop ResourceQuota", "resourceQuota", klog.KObj(q), "tenantQuota", w.Labels[backstopTenantLabel])
	return nil
}

func (r *backstopReconciler) create(ctx context.Context, w *corev1.ResourceQuota) error {
	err := r.client.Create(ctx, w)
	switch {
	case apierrors.IsNotFound(err): // a namespace the quota names that does not exist yet
		return nil
	case err != nil:
		return fmt.Errorf("creating backstop ResourceQuota in namespace %s: %w", w.Namespace, err)
	}
	klog.FromContext(ctx).V(2).Info("Created backstop ResourceQuota", "resourceQuota", klog.KObj(w), "tenantQuota", w.Labels[backstopTenantLabel])
	return nil
}
