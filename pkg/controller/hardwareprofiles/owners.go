package hardwareprofiles

import (
	"context"
	"errors"
	"fmt"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/hardwareprofile"
)

// errStatusConflict: the owner changed since it was read; it is looked at
// again shortly.
var errStatusConflict = errors.New("status conflict")

// ProfileReconciler publishes GpuProfiles.
type ProfileReconciler struct{ *Reconciler }

// Reconcile publishes one profile where it is meant to be.
func (r ProfileReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var p gpuaas.GpuProfile
	if err := r.Client.Get(ctx, req.NamespacedName, &p); err != nil {
		// A profile gone takes its HardwareProfiles through the owner
		// reference: nothing to do here.
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	settings := settingsOf(p.Spec.HardwareProfile)
	o := owner{kind: gpuaas.GpuProfileKind, name: p.Name, uid: p.UID, annotation: hardwareprofile.ProfileAnnotation,
		hpName: hardwareprofile.Name(p.Name),
		render: func(t target) (*unstructured.Unstructured, error) {
			if t.global {
				return hardwareprofile.Render(&p, t.namespace)
			}
			return hardwareprofile.RenderIn(&p, t.namespace, t.sched)
		}}
	if _, err := hardwareprofile.RenderIn(&p, "", hardwareprofile.Scheduling{}); err != nil {
		// The admin's settings do not hold: a retry renders the same, the
		// profile's next change brings it back; what is published stays.
		klog.FromContext(ctx).Error(err, "Not publishing the GpuProfile as a HardwareProfile", "gpuProfile", p.Name)
		res := result{published: p.Status.HardwareProfileNamespaces, problems: []string{err.Error()}}
		return r.done(ctx, &p, &p.Status.HardwareProfileNamespaces, &p.Status.Conditions, res)
	}
	var targets []target
	var problems []string
	if r.PerTenant {
		var err error
		if targets, problems, err = r.tenantTargets(ctx, settings, nil); err != nil {
			return reconcile.Result{}, err
		}
	}
	targets = r.withGlobal(targets, hardwareprofile.SchedulingOf(settings))
	res, err := r.publish(ctx, o, targets, problems)
	if err != nil {
		return reconcile.Result{}, err
	}
	return r.done(ctx, &p, &p.Status.HardwareProfileNamespaces, &p.Status.Conditions, res)
}

// ShapeReconciler publishes GpuShapes.
type ShapeReconciler struct{ *Reconciler }

// Reconcile publishes one shape in its tenants' namespaces that hold its
// template.
func (r ShapeReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var s gpuaas.GpuShape
	if err := r.Client.Get(ctx, req.NamespacedName, &s); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	settings := settingsOf(s.Spec.HardwareProfile)
	o := owner{kind: gpuaas.GpuShapeKind, name: s.Name, uid: s.UID, annotation: hardwareprofile.ShapeAnnotation,
		hpName: hardwareprofile.ShapeName(s.Name),
		render: func(t target) (*unstructured.Unstructured, error) {
			return hardwareprofile.RenderShape(&s, t.namespace, t.sched)
		}}
	if _, err := hardwareprofile.RenderShape(&s, "", hardwareprofile.Scheduling{}); err != nil {
		klog.FromContext(ctx).Error(err, "Not publishing the GpuShape as HardwareProfiles", "gpuShape", s.Name)
		res := result{published: s.Status.HardwareProfileNamespaces, problems: []string{err.Error()}}
		return r.done(ctx, &s, &s.Status.HardwareProfileNamespaces, &s.Status.Conditions, res)
	}
	// Only where the template is (the shapes reconciler's status): the
	// dashboard's workloads name it, and a HardwareProfile naming a
	// template that is not there starts nothing.
	templates := map[string]bool{}
	for _, ns := range s.Status.Namespaces {
		templates[ns] = true
	}
	targets, problems, err := r.tenantTargets(ctx, settings, func(q *gpuaas.TenantQuota, ns string) bool {
		return s.Entitles(q.Name) && templates[ns]
	})
	if err != nil {
		return reconcile.Result{}, err
	}
	res, err := r.publish(ctx, o, targets, problems)
	if err != nil {
		return reconcile.Result{}, err
	}
	return r.done(ctx, &s, &s.Status.HardwareProfileNamespaces, &s.Status.Conditions, res)
}

// done writes res into the owner's status (namespaces and conditions
// point into obj's status) and asks for the resync.
func (r *Reconciler) done(ctx context.Context, obj client.Object, namespaces *[]string, conditions *[]metav1.Condition, res result) (reconcile.Result, error) {
	err := r.writeStatus(ctx, obj, namespaces, conditions, res)
	switch {
	case errors.Is(err, errStatusConflict):
		return reconcile.Result{RequeueAfter: conflictRetry}, nil
	case err != nil:
		return reconcile.Result{}, err
	}
	return reconcile.Result{RequeueAfter: r.Resync}, nil
}

func (r *Reconciler) writeStatus(ctx context.Context, obj client.Object, namespaces *[]string, conditions *[]metav1.Condition, res result) error {
	beforeNS := append([]string(nil), *namespaces...)
	beforeConds := append([]metav1.Condition(nil), *conditions...)
	*namespaces = res.published
	if res.notServed {
		*namespaces = nil
	}
	meta.SetStatusCondition(conditions, published(res, obj.GetGeneration()))
	if equality.Semantic.DeepEqual(beforeNS, *namespaces) && equality.Semantic.DeepEqual(beforeConds, *conditions) {
		return nil
	}
	err := r.Client.Status().Update(ctx, obj)
	if apierrors.IsConflict(err) {
		return errStatusConflict
	}
	if err != nil {
		return fmt.Errorf("writing where %s is published: %w", obj.GetName(), err)
	}
	return nil
}
