// Package hardwareprofiles publishes the catalog in the OpenShift AI / Open
// Data Hub dashboard: one HardwareProfile (infrastructure.opendatahub.io/v1)
// per GpuProfile, enabled or not, in one configured namespace
// (--hardware-profile-namespace), rendered by pkg/hardwareprofile and owned
// by its GpuProfile so the garbage collector removes it with the profile.
//
// The HardwareProfile CRD is the opendatahub-operator's and may be absent,
// or installed after the controller starts: the reconciler asks the REST
// mapper on every pass (each profile's resync) and writes nothing while the
// kind is not served, and it reads and writes HardwareProfiles through an
// uncached client, so no informer waits on a kind that may never come.
// Without an informer a hand edit is put back on the profile's next resync.
package hardwareprofiles

import (
	"context"
	"fmt"
	"maps"
	"reflect"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller/internal/kinds"
	"github.com/gpuaas/gpu-dra-driver/pkg/deviceclass"
	"github.com/gpuaas/gpu-dra-driver/pkg/hardwareprofile"
)

// Reconciler keeps each GpuProfile's HardwareProfile in Namespace.
type Reconciler struct {
	// Profiles reads GpuProfiles (the manager's cache).
	Profiles client.Reader
	// Direct reads and writes HardwareProfiles, uncached.
	Direct client.Client
	// Mapper tells whether the HardwareProfile kind is served; it must
	// ask discovery again on a miss (the manager's does), so that a CRD
	// installed later is found.
	Mapper    meta.RESTMapper
	Namespace string
	// Resync is how often a profile is looked at again without a change
	// of it: a later CRD install and hand edits are caught then.
	Resync time.Duration
}

// Setup adds the reconciler to the manager; direct is an uncached client.
func Setup(mgr ctrl.Manager, direct client.Client, namespace string, resync time.Duration) error {
	r := &Reconciler{Profiles: mgr.GetClient(), Direct: direct, Mapper: mgr.GetRESTMapper(), Namespace: namespace, Resync: resync}
	// The spec (its generation: deletion bumps it too), not the status
	// the catalog rewrites on every claim's allocation: nothing rendered
	// comes from the status.
	err := ctrl.NewControllerManagedBy(mgr).Named("hardwareprofile").
		For(&gpuaas.GpuProfile{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Complete(r)
	if err != nil {
		return fmt.Errorf("setting up the HardwareProfile controller: %w", err)
	}
	return nil
}

// Reconcile writes one profile's HardwareProfile where the kind is served.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	logger := klog.FromContext(ctx)
	var p gpuaas.GpuProfile
	if err := r.Profiles.Get(ctx, req.NamespacedName, &p); err != nil {
		// A profile gone takes its HardwareProfile through the owner
		// reference: nothing to do here.
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	again := reconcile.Result{RequeueAfter: r.Resync}
	served, err := kinds.Served(r.Mapper, hardwareprofile.GroupVersionKind.GroupKind(), hardwareprofile.GroupVersionKind.Version)
	if err != nil {
		return reconcile.Result{}, err
	}
	if !served {
		logger.V(2).Info("HardwareProfile is not served: the profile is not published to the dashboard", "gpuProfile", p.Name)
		return again, nil
	}
	want, err := hardwareprofile.Render(&p, r.Namespace)
	if err != nil {
		// The admin's settings do not hold: a retry renders the same, the
		// profile's next change brings it back.
		logger.Error(err, "Not publishing the GpuProfile as a HardwareProfile", "gpuProfile", p.Name)
		return again, nil
	}
	if err := r.apply(ctx, &p, want); err != nil {
		return reconcile.Result{}, err
	}
	return again, nil
}

// apply creates want, or puts what the renderer owns back into the
// HardwareProfile that exists: spec.identifiers and spec.scheduling, our
// labels and annotations and the owner reference. Other spec fields, labels
// and annotations (the dashboard's own) stay.
func (r *Reconciler) apply(ctx context.Context, p *gpuaas.GpuProfile, want *unstructured.Unstructured) error {
	logger := klog.FromContext(ctx)
	key := client.ObjectKeyFromObject(want)
	have := &unstructured.Unstructured{}
	have.SetGroupVersionKind(hardwareprofile.GroupVersionKind)
	err := r.Direct.Get(ctx, key, have)
	if apierrors.IsNotFound(err) {
		if err := r.Direct.Create(ctx, want); err != nil {
			return fmt.Errorf("creating HardwareProfile %s for GpuProfile %s: %w", key, p.Name, err)
		}
		logger.Info("Published GpuProfile as a HardwareProfile", "gpuProfile", p.Name, "hardwareProfile", key)
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading HardwareProfile %s: %w", key, err)
	}
	if !ours(have, p) {
		return fmt.Errorf("HardwareProfile %s exists and is not GpuProfile %s's: rename or delete it", key, p.Name)
	}
	updated := have.DeepCopy()
	for _, field := range []string{"identifiers", "scheduling"} {
		if err := unstructured.SetNestedField(updated.Object, want.Object["spec"].(map[string]any)[field], "spec", field); err != nil {
			return fmt.Errorf("HardwareProfile %s: %w", key, err)
		}
	}
	updated.SetLabels(merged(have.GetLabels(), want.GetLabels()))
	updated.SetAnnotations(merged(have.GetAnnotations(), want.GetAnnotations()))
	updated.SetOwnerReferences(want.GetOwnerReferences())
	if reflect.DeepEqual(have.Object, updated.Object) {
		return nil
	}
	if err := r.Direct.Update(ctx, updated); err != nil {
		return fmt.Errorf("updating HardwareProfile %s: %w", key, err)
	}
	logger.Info("Put HardwareProfile back in line with its GpuProfile", "gpuProfile", p.Name, "hardwareProfile", key)
	return nil
}

func merged(have, want map[string]string) map[string]string {
	out := maps.Clone(have)
	if out == nil {
		out = map[string]string{}
	}
	maps.Copy(out, want)
	return out
}

// ours tells whether a HardwareProfile is p's: owned by it, or (its owner
// reference edited away, or p deleted and made again before the garbage
// collector came by) labelled as ours and naming p; anything else is an
// admin's own, never taken over.
func ours(obj *unstructured.Unstructured, p *gpuaas.GpuProfile) bool {
	for _, ref := range obj.GetOwnerReferences() {
		if ref.UID == p.UID {
			return true
		}
	}
	return obj.GetLabels()[deviceclass.ManagedByLabel] == deviceclass.ManagedByValue &&
		obj.GetAnnotations()[hardwareprofile.ProfileAnnotation] == p.Name
}
