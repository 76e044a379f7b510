package kueuemirror

import (
	"context"
	"fmt"
	"reflect"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/kueue"
)

// kueueQueueReconciler keeps, for each TenantQuota with spec.kueue, the
// ClusterQueue that mirrors it (kueue.ClusterQueueSpec): the namespaces the
// quota reconciler resolved into status, the cohort, and the GPU units.
// The ClusterQueue is owned by the TenantQuota, so it goes with it. Only
// the mirrored fields are written; the admin's others stay.
type kueueQueueReconciler struct {
	quotas client.Reader // the cache
	// direct reads and writes ClusterQueues without an informer: Kueue
	// may be installed after the controller starts.
	direct client.Client
	resync time.Duration
}

func (r *kueueQueueReconciler) setup(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).Named("kueue-clusterqueue").For(&gpuaas.TenantQuota{}).Complete(r)
}

func (r *kueueQueueReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var q gpuaas.TenantQuota
	if err := r.quotas.Get(ctx, req.NamespacedName, &q); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if q.Spec.Kueue == nil || q.Spec.Limits.GpuUnits == nil || !q.DeletionTimestamp.IsZero() {
		return reconcile.Result{}, nil
	}
	tenant := kueue.TenantQueue{Namespaces: q.Status.Namespaces, Cohort: q.Spec.Cohort, GpuUnits: *q.Spec.Limits.GpuUnits}
	if q.Spec.BorrowingLimit != nil {
		tenant.Borrowing = q.Spec.BorrowingLimit.GpuUnits
	}
	spec, err := kueue.ClusterQueueSpec(tenant)
	if err != nil { // no namespaces resolved yet: the status update brings us back
		klog.FromContext(ctx).V(2).Info("ClusterQueue not kept yet", "tenantQuota", q.Name, "reason", err.Error())
		return reconcile.Result{RequeueAfter: r.resync}, nil
	}
	err = r.apply(ctx, &q, spec)
	if meta.IsNoMatchError(err) {
		klog.FromContext(ctx).Info("Kueue is not installed: no ClusterQueue for the TenantQuota", "tenantQuota", q.Name)
		return reconcile.Result{RequeueAfter: r.resync}, nil
	}
	return reconcile.Result{RequeueAfter: r.resync}, err
}

// apply creates the ClusterQueue, or writes the mirrored fields into the
// one that exists (which must be this TenantQuota's).
func (r *kueueQueueReconciler) apply(ctx context.Context, q *gpuaas.TenantQuota, spec map[string]any) error {
	cq := kueue.Object("ClusterQueue")
	name := q.Spec.Kueue.ClusterQueue
	err := r.direct.Get(ctx, types.NamespacedName{Name: name}, cq)
	if apierrors.IsNotFound(err) {
		cq.SetName(name)
		cq.SetOwnerReferences([]metav1.OwnerReference{ownerOf(q)})
		cq.Object["spec"] = spec
		if err := r.direct.Create(ctx, cq); err != nil {
			return fmt.Errorf("creating ClusterQueue %s: %w", name, err)
		}
		klog.FromContext(ctx).Info("Created Kueue ClusterQueue for TenantQuota", "clusterQueue", name, "tenantQuota", q.Name)
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading ClusterQueue %s: %w", name, err)
	}
	if !ownedByUID(cq, q.UID) {
		return fmt.Errorf("ClusterQueue %s exists and is not TenantQuota %s's: rename one of them", name, q.Name)
	}
	before := cq.DeepCopy()
	for field, value := range spec {
		if err := unstructured.SetNestedField(cq.Object, value, "spec", field); err != nil {
			return fmt.Errorf("ClusterQueue %s: %w", name, err)
		}
	}
	if _, hasCohort := spec["cohortName"]; !hasCohort {
		unstructured.RemoveNestedField(cq.Object, "spec", "cohortName")
	}
	if reflect.DeepEqual(before.Object["spec"], cq.Object["spec"]) {
		return nil
	}
	if err := r.direct.Update(ctx, cq); err != nil {
		return fmt.Errorf("updating ClusterQueue %s: %w", name, err)
	}
	return nil
}

func ownerOf(q *gpuaas.TenantQuota) metav1.OwnerReference {
	return metav1.OwnerReference{APIVersion: gpuaas.GroupVersion.String(), Kind: "TenantQuota", Name: q.Name, UID: q.UID,
		Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}
}

func ownedByUID(obj metav1.Object, uid types.UID) bool {
	for _, ref := range obj.GetOwnerReferences() {
		if ref.UID == uid {
			return true
		}
	}
	return false
}
