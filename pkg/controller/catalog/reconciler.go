package catalog

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"sync/atomic"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/deviceclass"
)

// Devices is what the catalog reads of the quota books: the devices a
// profile's class selects, and the MIG profiles nodes publish. The books'
// Accountant answers it from its pricing snapshot; the catalog needs
// nothing else of them.
type Devices interface {
	// ProfileDevices counts the published devices the selectors (a
	// class's) select, and how many of them claims hold.
	ProfileDevices(ctx context.Context, selectors []string) (ProfileReport, error)
	// PublishedMigProfiles are the MIG profile names nodes publish.
	PublishedMigProfiles(ctx context.Context) (map[string]bool, error)
}

// ProfileReport is what the profile reconciler writes to a GpuProfile's
// status.
type ProfileReport struct {
	Matching, Allocated int
	// Free counts the matching devices a claim could be given now: not
	// allocated, and not blocked by what shares their GPU (a whole GPU
	// whose MIG partition is taken, a share device with no room left).
	Free int
}

// Reconciler keeps each GpuProfile's DeviceClass as the profile says (hand
// edits are reverted), removes a disabled profile's class once no claim
// uses it, and reports matching, allocated and free devices.
type Reconciler struct {
	client  client.Client
	devices Devices
	resync  time.Duration
	started time.Time // see released
	// beforeCreate runs before a DeviceClass is created and must succeed:
	// it takes the name off the claim webhooks' foreign classes, so no
	// claim naming a class of ours skips the webhook.
	beforeCreate func(ctx context.Context, class string) error
	// ernDropped: the API server was seen to drop a class's
	// extendedResourceName (DRAExtendedResource off); classes are then in
	// sync without it. It holds until the controller restarts.
	ernDropped atomic.Bool
}

// NewReconciler reconciles profiles through c (the manager's client, whose
// cache indexes claims by IndexClaimClasses), counting devices with
// devices, every resync; started is when this controller started (see
// released); beforeCreate, if set, runs before a DeviceClass is created and
// must succeed.
func NewReconciler(c client.Client, devices Devices, resync time.Duration, started time.Time,
	beforeCreate func(ctx context.Context, class string) error) *Reconciler {
	return &Reconciler{client: c, devices: devices, resync: resync, started: started, beforeCreate: beforeCreate}
}

func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var p gpuaas.GpuProfile
	if err := r.client.Get(ctx, req.NamespacedName, &p); err != nil {
		if apierrors.IsNotFound(err) {
			deleteProfileMetrics(req.Name) // the class goes with it: owner reference
			return reconcile.Result{}, nil
		}
		return reconcile.Result{}, fmt.Errorf("reading GpuProfile %s: %w", req.Name, err)
	}
	if !p.DeletionTimestamp.IsZero() {
		return r.drainDeleted(ctx, &p)
	}
	if err := r.addFinalizer(ctx, &p); err != nil {
		return retryIfCacheBehind(ctx, err)
	}
	status := p.Status.DeepCopy()
	status.ObservedGeneration = p.Generation
	ready, err := r.syncClass(ctx, &p, status)
	if cacheBehind(err) {
		return retryIfCacheBehind(ctx, err)
	}
	if err != nil {
		ready = condition(gpuaas.ConditionReady, false, gpuaas.ReasonApplyFailed, err.Error())
	}
	ready.ObservedGeneration = p.Generation
	meta.SetStatusCondition(&status.Conditions, ready)
	report, rerr := r.devices.ProfileDevices(ctx, deviceclass.Selectors(&p.Spec.Selector))
	if rerr != nil {
		return reconcile.Result{}, rerr
	}
	status.MatchingDevices, status.AllocatedDevices = int32(report.Matching), int32(report.Allocated)
	status.FreeDevices = int32(report.Free)
	setProfileMetrics(p.Name, report)
	if uerr := r.updateStatus(ctx, &p, status); uerr != nil {
		return reconcile.Result{}, uerr
	}
	return reconcile.Result{RequeueAfter: r.resync}, err
}

// cacheBehindRetry is when a reconcile refused for a stale read runs
// again, if no event of the newer object came first.
const cacheBehindRetry = time.Second

// cacheBehind tells a refusal that says the reconciler read a cache behind
// the API server: the class it creates is there already (its own create of
// a moment ago, not yet in the cache), or the object it writes changed.
func cacheBehind(err error) bool {
	return apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err)
}

// retryIfCacheBehind requeues a reconcile refused for a stale read, which
// is no error (the status keeps what it said: the next pass, on a fresh
// read, writes it); any other refusal is returned as the error it is.
func retryIfCacheBehind(ctx context.Context, err error) (reconcile.Result, error) {
	if !cacheBehind(err) {
		return reconcile.Result{}, err
	}
	klog.FromContext(ctx).V(4).Info("Read a cache behind the API server; reconciling again", "err", err)
	return reconcile.Result{RequeueAfter: cacheBehindRetry}, nil
}

// syncClass brings the DeviceClass in line and returns the Ready condition.
// An invalid profile leaves an existing class alone: claims already using it
// keep working while the admin fixes the profile.
func (r *Reconciler) syncClass(ctx context.Context, p *gpuaas.GpuProfile, status *gpuaas.GpuProfileStatus) (metav1.Condition, error) {
	have, err := r.getClass(ctx, p.Name)
	if err != nil {
		return metav1.Condition{}, err
	}
	status.DeviceClassName = ""
	if have != nil && !ownedBy(have, p) {
		return condition(gpuaas.ConditionReady, false, gpuaas.ReasonDeviceClassConflict, fmt.Sprintf(
			"DeviceClass %q exists and was not rendered from this profile; delete it or rename the profile", p.Name)), nil
	}
	if have != nil {
		status.DeviceClassName = have.Name
	}
	migs, err := r.devices.PublishedMigProfiles(ctx)
	if err != nil {
		return metav1.Condition{}, err
	}
	if !p.IsEnabled() {
		return r.disable(ctx, p, have, status, "disabled")
	}
	want, err := deviceclass.Build(p, migs)
	if err != nil {
		return condition(gpuaas.ConditionReady, false, gpuaas.ReasonInvalidSpec, err.Error()), nil
	}
	dropped, err := r.apply(ctx, want, have)
	if err != nil {
		return metav1.Condition{}, err
	}
	status.DeviceClassName = want.Name
	setFieldsDropped(status, dropped, p)
	return condition(gpuaas.ConditionReady, true, gpuaas.ReasonDeviceClassReady, fmt.Sprintf("DeviceClass %q is in sync", want.Name)), nil
}

// addFinalizer makes a later deletion wait for the drain (drainDeleted),
// unless the chart's uninstall released the profile after this controller
// started (ReleasedAnnotation): the controller is going away with it.
func (r *Reconciler) addFinalizer(ctx context.Context, p *gpuaas.GpuProfile) error {
	if controllerutil.ContainsFinalizer(p, gpuaas.DrainFinalizer) || r.released(p) {
		return nil
	}
	patch := client.MergeFromWithOptions(p.DeepCopy(), client.MergeFromWithOptimisticLock{})
	controllerutil.AddFinalizer(p, gpuaas.DrainFinalizer)
	delete(p.Annotations, gpuaas.ReleasedAnnotation)
	if err := r.client.Patch(ctx, p, patch); err != nil {
		return fmt.Errorf("adding finalizer to GpuProfile %s: %w", p.Name, err)
	}
	return nil
}

func (r *Reconciler) released(p *gpuaas.GpuProfile) bool {
	at, err := time.Parse(time.RFC3339, p.Annotations[gpuaas.ReleasedAnnotation])
	return err == nil && !at.Before(r.started.Truncate(time.Second))
}

// drainDeleted treats a deleted profile like a disabled one: its class
// stays while claims name it, then goes, and only then does the profile.
func (r *Reconciler) drainDeleted(ctx context.Context, p *gpuaas.GpuProfile) (reconcile.Result, error) {
	if !controllerutil.ContainsFinalizer(p, gpuaas.DrainFinalizer) {
		return reconcile.Result{}, nil
	}
	have, err := r.getClass(ctx, p.Name)
	if err != nil {
		return reconcile.Result{}, err
	}
	if have != nil && !ownedBy(have, p) {
		have = nil // someone else's class: not ours to drain or delete
	}
	status := p.Status.DeepCopy()
	ready, err := r.disable(ctx, p, have, status, "deleted")
	if err != nil {
		return reconcile.Result{}, err
	}
	if ready.Reason == gpuaas.ReasonDraining {
		meta.SetStatusCondition(&status.Conditions, ready)
		return reconcile.Result{RequeueAfter: r.resync}, r.updateStatus(ctx, p, status)
	}
	patch := client.MergeFrom(p.DeepCopy())
	controllerutil.RemoveFinalizer(p, gpuaas.DrainFinalizer)
	if err := r.client.Patch(ctx, p, patch); err != nil && !apierrors.IsNotFound(err) {
		return reconcile.Result{}, fmt.Errorf("removing finalizer of GpuProfile %s: %w", p.Name, err)
	}
	klog.FromContext(ctx).Info("Deleted GpuProfile drained", "profile", p.Name)
	return reconcile.Result{}, nil
}

func (r *Reconciler) getClass(ctx context.Context, name string) (*resourceapi.DeviceClass, error) {
	var dc resourceapi.DeviceClass
	err := r.client.Get(ctx, types.NamespacedName{Name: name}, &dc)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading DeviceClass %s: %w", name, err)
	}
	return &dc, nil
}

func ownedBy(dc *resourceapi.DeviceClass, p *gpuaas.GpuProfile) bool {
	ref := metav1.GetControllerOf(dc)
	return ref != nil && ref.Kind == gpuaas.GpuProfileKind && ref.UID == p.UID
}

// apply creates the class or reverts it to what the profile renders. It
// reports whether the API server drops the class's extendedResourceName
// (feature gate DRAExtendedResource off, the default before 1.36): the
// class is then in sync without it, instead of being rewritten at every
// resync (issue 35).
func (r *Reconciler) apply(ctx context.Context, want, have *resourceapi.DeviceClass) (bool, error) {
	logger := klog.FromContext(ctx)
	wantERN := want.Spec.ExtendedResourceName != nil
	if have == nil {
		if r.beforeCreate != nil {
			if err := r.beforeCreate(ctx, want.Name); err != nil {
				return false, fmt.Errorf("taking DeviceClass %s off the claim webhooks' foreign classes: %w", want.Name, err)
			}
		}
		if err := r.client.Create(ctx, want); err != nil {
			return false, fmt.Errorf("creating DeviceClass %s: %w", want.Name, err)
		}
		logger.Info("Created DeviceClass", "deviceClass", want.Name)
		return r.noteDropped(wantERN, want), nil
	}
	if classInSync(want, have) {
		return false, nil
	}
	if r.ernDropped.Load() && wantERN && have.Spec.ExtendedResourceName == nil {
		bare := want.DeepCopy()
		bare.Spec.ExtendedResourceName = nil
		if classInSync(bare, have) {
			return true, nil
		}
	}
	updated := have.DeepCopy()
	updated.Spec = want.Spec
	updated.OwnerReferences = want.OwnerReferences
	updated.Labels = merged(have.Labels, want.Labels)
	updated.Annotations = merged(without(have.Annotations, deviceclass.DisplayNameAnnotation, deviceclass.DescriptionAnnotation), want.Annotations)
	if err := r.client.Update(ctx, updated); err != nil {
		return false, fmt.Errorf("updating DeviceClass %s: %w", want.Name, err)
	}
	logger.Info("Reverted DeviceClass to its profile", "deviceClass", want.Name)
	return r.noteDropped(wantERN, updated), nil
}

// noteDropped tells whether the stored class lost the extendedResourceName
// the controller wrote, and remembers it.
func (r *Reconciler) noteDropped(wrote bool, stored *resourceapi.DeviceClass) bool {
	if !wrote || stored.Spec.ExtendedResourceName != nil {
		return false
	}
	r.ernDropped.Store(true)
	return true
}

// setFieldsDropped sets or clears the FieldsDropped condition.
func setFieldsDropped(status *gpuaas.GpuProfileStatus, dropped bool, p *gpuaas.GpuProfile) {
	if !dropped {
		meta.RemoveStatusCondition(&status.Conditions, gpuaas.ConditionFieldsDropped)
		return
	}
	c := condition(gpuaas.ConditionFieldsDropped, true, gpuaas.ReasonFeatureGateOff, fmt.Sprintf(
		"The API server drops the DeviceClass's extendedResourceName (feature gate DRAExtendedResource off): pods asking for %s "+
			"are not served by DRA. Enable the gate (docs/install.md) and restart the controller.", ptr.Deref(p.Spec.ExtendedResourceName, "")))
	c.ObservedGeneration = p.Generation
	meta.SetStatusCondition(&status.Conditions, c)
}

// classInSync compares what the controller owns of a class; opaque
// parameters compare as JSON values, not bytes.
func classInSync(want, have *resourceapi.DeviceClass) bool {
	if !equality.Semantic.DeepEqual(want.Spec.Selectors, have.Spec.Selectors) ||
		!equality.Semantic.DeepEqual(want.Spec.ExtendedResourceName, have.Spec.ExtendedResourceName) ||
		!equality.Semantic.DeepEqual(want.OwnerReferences, have.OwnerReferences) ||
		len(want.Spec.Config) != len(have.Spec.Config) {
		return false
	}
	for i := range want.Spec.Config {
		w, h := want.Spec.Config[i].Opaque, have.Spec.Config[i].Opaque
		if (w == nil) != (h == nil) || (w != nil && (w.Driver != h.Driver || !sameJSON(w.Parameters.Raw, h.Parameters.Raw))) {
			return false
		}
	}
	for k, v := range want.Labels {
		if have.Labels[k] != v {
			return false
		}
	}
	for _, k := range []string{deviceclass.DisplayNameAnnotation, deviceclass.DescriptionAnnotation} {
		if want.Annotations[k] != have.Annotations[k] {
			return false
		}
	}
	return true
}

func sameJSON(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return string(a) == string(b)
	}
	return reflect.DeepEqual(x, y)
}

func merged(base, over map[string]string) map[string]string {
	out := maps.Clone(base)
	if out == nil {
		out = map[string]string{}
	}
	maps.Copy(out, over)
	return out
}

func without(m map[string]string, keys ...string) map[string]string {
	out := maps.Clone(m)
	for _, k := range keys {
		delete(out, k)
	}
	return out
}

// disable removes the class of a disabled (or deleted: why) profile once
// no claim names it; until then pending claims can still be allocated.
func (r *Reconciler) disable(ctx context.Context, p *gpuaas.GpuProfile, have *resourceapi.DeviceClass,
	status *gpuaas.GpuProfileStatus, why string) (metav1.Condition, error) {
	if have == nil {
		return condition(gpuaas.ConditionReady, false, gpuaas.ReasonDisabled, "profile "+why+"; it has no DeviceClass"), nil
	}
	var claims resourceapi.ResourceClaimList
	if err := r.client.List(ctx, &claims, client.MatchingFields{IndexClaimClasses: p.Name}); err != nil {
		return metav1.Condition{}, fmt.Errorf("listing claims of DeviceClass %s: %w", p.Name, err)
	}
	if n := len(claims.Items); n > 0 {
		return condition(gpuaas.ConditionReady, false, gpuaas.ReasonDraining, fmt.Sprintf(
			"profile %s; DeviceClass %q stays until its %d ResourceClaim(s) are gone (e.g. %s/%s)",
			why, p.Name, n, claims.Items[0].Namespace, claims.Items[0].Name)), nil
	}
	if err := r.client.Delete(ctx, have, client.Preconditions{UID: &have.UID}); err != nil && !apierrors.IsNotFound(err) {
		return metav1.Condition{}, fmt.Errorf("deleting DeviceClass %s: %w", p.Name, err)
	}
	klog.FromContext(ctx).Info("Deleted DeviceClass of "+why+" profile", "deviceClass", p.Name)
	status.DeviceClassName = ""
	return condition(gpuaas.ConditionReady, false, gpuaas.ReasonDisabled, "profile "+why+"; its DeviceClass was removed"), nil
}

func (r *Reconciler) updateStatus(ctx context.Context, p *gpuaas.GpuProfile, status *gpuaas.GpuProfileStatus) error {
	if equality.Semantic.DeepEqual(&p.Status, status) {
		return nil
	}
	p.Status = *status
	err := r.client.Status().Update(ctx, p)
	if apierrors.IsConflict(err) {
		// The cache was behind; the newer object's event reconciles it
		// again. Not an error (see the quota reconciler).
		return nil
	}
	if err != nil {
		return fmt.Errorf("updating status of GpuProfile %s: %w", p.Name, err)
	}
	return nil
}

func condition(typ string, ok bool, reason, msg string) metav1.Condition {
	status := metav1.ConditionFalse
	if ok {
		status = metav1.ConditionTrue
	}
	return metav1.Condition{Type: typ, Status: status, Reason: reason, Message: msg}
}

// IndexClaimClasses indexes ResourceClaims by the DeviceClasses their
// requests (and firstAvailable alternatives) name; the reconciler lists a
// class's claims by it.
const IndexClaimClasses = "spec.devices.requests.deviceClassName"

// ClaimClasses is the IndexClaimClasses index function.
func ClaimClasses(obj client.Object) []string {
	claim, ok := obj.(*resourceapi.ResourceClaim)
	if !ok {
		return nil
	}
	var out []string
	for _, r := range claim.Spec.Devices.Requests {
		if r.Exactly != nil {
			out = append(out, r.Exactly.DeviceClassName)
		}
		for _, s := range r.FirstAvailable {
			out = append(out, s.DeviceClassName)
		}
	}
	return out
}
