package shapes

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/quota"
	"github.com/gpuaas/gpu-dra-driver/pkg/shape"
)

// Reconciler keeps each GpuShape's templates and status.
type Reconciler struct {
	// client reads through the manager's cache, which holds only the
	// ResourceClaimTemplates that carry ShapeLabel and our driver's
	// ResourceSlices.
	client client.Client
	// foreign holds the other drivers' ResourceSlices (ForeignSliceCache);
	// nil: client holds every slice. The count reads of them only the
	// drivers the shape's classes reach (otherDrivers).
	foreign client.Reader
	// reach, where set, is told which other drivers each shape reaches
	// before foreign is read, so it holds just those (foreignCaches).
	reach func(ctx context.Context, shape string, drivers sets.Set[string]) error
	// live reads past the cache: a template of a shape's name that the
	// cache does not hold (created by someone else, or ours with its
	// label removed).
	live   client.Reader
	resync time.Duration
	// matcher remembers selector matches across counts: the slices come
	// from the cache without a deep copy, so a device's address is stable
	// until its slice changes.
	matcher *shape.Matcher
	// drains: resource.k8s.io/v1 DeviceTaintRules are served (and
	// watched), so the count leaves out the devices they drain.
	drains bool
}

// NewReconciler reconciles shapes through c, reading templates the cache
// does not hold from live, every resync.
func NewReconciler(c client.Client, live client.Reader, resync time.Duration) *Reconciler {
	return &Reconciler{client: c, live: live, resync: resync, matcher: shape.NewMatcher()}
}

// WithForeignSlices makes the count read other drivers' slices (a NIC
// part) from foreign (ForeignSliceCache), where the client's cache holds
// only ours.
func (r *Reconciler) WithForeignSlices(foreign client.Reader) *Reconciler {
	r.foreign = foreign
	return r
}

// withForeignCaches reads other drivers' slices from f, which caches those
// of the drivers the shapes reach.
func (r *Reconciler) withForeignCaches(f *foreignCaches) *Reconciler {
	r.foreign, r.reach = f, f.reach
	return r
}

// WithDrains makes the count read the DeviceTaintRules (served from 1.37):
// a device an admin drains is not placeable.
func (r *Reconciler) WithDrains() *Reconciler {
	r.drains = true
	return r
}

func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var s gpuaas.GpuShape
	if err := r.client.Get(ctx, req.NamespacedName, &s); err != nil {
		if apierrors.IsNotFound(err) {
			// Its templates go with it: they are owned by it.
			shapePlaceable.DeletePartialMatch(map[string]string{"shape": req.Name})
			return reconcile.Result{}, r.reachDrivers(ctx, req.Name, nil)
		}
		return reconcile.Result{}, fmt.Errorf("reading GpuShape %s: %w", req.Name, err)
	}
	if !s.DeletionTimestamp.IsZero() {
		return reconcile.Result{}, nil
	}
	status := s.Status.DeepCopy()
	status.ObservedGeneration = s.Generation
	parts, err := r.parts(ctx, &s)
	if err != nil {
		return reconcile.Result{}, err
	}
	want, err := r.entitled(ctx, &s)
	if err != nil {
		return reconcile.Result{}, err
	}
	have, conflicts, err := r.syncTemplates(ctx, &s, want)
	if err != nil {
		return reconcile.Result{}, err
	}
	status.Namespaces, status.Templates = have, int32(len(have))
	missing := shape.Missing(&s, parts)
	count, err := r.placeable(ctx, &s, parts, missing)
	if err != nil {
		return reconcile.Result{}, err
	}
	status.Placeable = int32(count.Placeable)
	status.PlaceableMessage = count.Message(shape.Describe(&s))
	shapePlaceable.WithLabelValues(s.Name).Set(float64(count.Placeable))
	ready := readyCondition(missing, conflicts, len(have))
	ready.ObservedGeneration = s.Generation
	meta.SetStatusCondition(&status.Conditions, ready)
	if err := r.updateStatus(ctx, &s, status); err != nil {
		return reconcile.Result{}, err
	}
	return reconcile.Result{RequeueAfter: r.resync}, nil
}

func readyCondition(missing, conflicts []string, templates int) metav1.Condition {
	switch {
	case len(missing) > 0:
		return condition(false, gpuaas.ReasonPartsMissing, strings.Join(missing, "; "))
	case len(conflicts) > 0:
		return condition(false, gpuaas.ReasonTemplateConflict, strings.Join(conflicts, "; "))
	}
	return condition(true, gpuaas.ReasonShapeReady, fmt.Sprintf("%d ResourceClaimTemplate(s) in sync; every part exists", templates))
}

// parts reads the profiles and classes the shape's requests name.
func (r *Reconciler) parts(ctx context.Context, s *gpuaas.GpuShape) (shape.Parts, error) {
	parts := shape.Parts{Profiles: map[string]*gpuaas.GpuProfile{}, Classes: map[string]*resourceapi.DeviceClass{}}
	for i := range s.Spec.Requests {
		req := &s.Spec.Requests[i]
		if req.Profile != "" {
			var p gpuaas.GpuProfile
			err := r.client.Get(ctx, types.NamespacedName{Name: req.Profile}, &p)
			switch {
			case err == nil:
				parts.Profiles[p.Name] = &p
			case !apierrors.IsNotFound(err):
				return parts, fmt.Errorf("reading GpuProfile %s: %w", req.Profile, err)
			}
		}
		var dc resourceapi.DeviceClass
		err := r.client.Get(ctx, types.NamespacedName{Name: req.ClassName()}, &dc)
		switch {
		case err == nil:
			parts.Classes[dc.Name] = &dc
		case !apierrors.IsNotFound(err):
			return parts, fmt.Errorf("reading DeviceClass %s: %w", req.ClassName(), err)
		}
	}
	return parts, nil
}

// entitled are the existing, live namespaces charged to the TenantQuotas
// the shape names, as the quota books resolve them (an older quota wins
// a namespace two claim), sorted.
func (r *Reconciler) entitled(ctx context.Context, s *gpuaas.GpuShape) ([]string, error) {
	if len(s.Spec.Tenants) == 0 {
		return nil, nil
	}
	var quotas gpuaas.TenantQuotaList
	if err := r.client.List(ctx, &quotas); err != nil {
		return nil, fmt.Errorf("listing TenantQuotas: %w", err)
	}
	var nsList corev1.NamespaceList
	if err := r.client.List(ctx, &nsList); err != nil {
		return nil, fmt.Errorf("listing Namespaces: %w", err)
	}
	_, assign := quota.Resolve(quotas.Items, nsList.Items)
	live := map[string]bool{}
	for _, ns := range nsList.Items {
		live[ns.Name] = ns.DeletionTimestamp.IsZero()
	}
	var out []string
	for _, t := range s.Spec.Tenants {
		for _, ns := range assign.Namespaces[t] {
			if live[ns] && !slices.Contains(out, ns) {
				out = append(out, ns)
			}
		}
	}
	slices.Sort(out)
	return out, nil
}

// syncTemplates makes the shape's templates those of want: created where
// missing, re-created where their spec differs (a template's spec is
// immutable), their label and owner put back, deleted where the namespace
// is no longer entitled. A template of the shape's name that the shape
// did not render is left alone and reported. It returns the namespaces
// that hold the shape's template.
func (r *Reconciler) syncTemplates(ctx context.Context, s *gpuaas.GpuShape, want []string) (have, conflicts []string, err error) {
	var list resourceapi.ResourceClaimTemplateList
	if err := r.client.List(ctx, &list, client.MatchingLabels{gpuaas.ShapeLabel: s.Name}); err != nil {
		return nil, nil, fmt.Errorf("listing ResourceClaimTemplates of GpuShape %s: %w", s.Name, err)
	}
	for i := range list.Items {
		t := &list.Items[i]
		if t.Name != s.Name || !ownedBy(t, s) || slices.Contains(want, t.Namespace) {
			continue
		}
		if err := r.delete(ctx, t, "its namespace is no longer entitled"); err != nil {
			return nil, nil, err
		}
	}
	for _, ns := range want {
		ok, conflict, err := r.syncTemplate(ctx, s, ns)
		if err != nil {
			return nil, nil, err
		}
		if ok {
			have = append(have, ns)
		}
		if conflict != "" {
			conflicts = append(conflicts, conflict)
		}
	}
	return have, conflicts, nil
}

func (r *Reconciler) syncTemplate(ctx context.Context, s *gpuaas.GpuShape, ns string) (bool, string, error) {
	want := shape.Template(s, ns)
	key := client.ObjectKeyFromObject(want)
	var t resourceapi.ResourceClaimTemplate
	err := r.client.Get(ctx, key, &t)
	if apierrors.IsNotFound(err) {
		// Not in the cache: none, or one without our label.
		err = r.live.Get(ctx, key, &t)
		if apierrors.IsNotFound(err) {
			return r.create(ctx, want)
		}
	}
	if err != nil {
		return false, "", fmt.Errorf("reading ResourceClaimTemplate %s: %w", key, err)
	}
	if !ownedBy(&t, s) {
		return false, fmt.Sprintf("ResourceClaimTemplate %s exists and was not rendered from this shape", key), nil
	}
	if !equality.Semantic.DeepEqual(t.Spec, want.Spec) {
		if err := r.delete(ctx, &t, "its spec was not the shape's"); err != nil {
			return false, "", err
		}
		return r.create(ctx, want)
	}
	if t.Labels[gpuaas.ShapeLabel] != s.Name || !equality.Semantic.DeepEqual(t.OwnerReferences, want.OwnerReferences) {
		updated := t.DeepCopy()
		if updated.Labels == nil {
			updated.Labels = map[string]string{}
		}
		updated.Labels[gpuaas.ShapeLabel] = s.Name
		updated.OwnerReferences = want.OwnerReferences
		if err := r.client.Update(ctx, updated); err != nil {
			return false, "", fmt.Errorf("updating ResourceClaimTemplate %s: %w", key, err)
		}
		klog.FromContext(ctx).Info("Reverted ResourceClaimTemplate's label and owner to its shape", "template", key)
	}
	return true, "", nil
}

func (r *Reconciler) create(ctx context.Context, t *resourceapi.ResourceClaimTemplate) (bool, string, error) {
	err := r.client.Create(ctx, t)
	if apierrors.IsAlreadyExists(err) {
		return false, "", nil // created since the live read; the next reconcile looks at it
	}
	if err != nil {
		return false, "", fmt.Errorf("creating ResourceClaimTemplate %s/%s: %w", t.Namespace, t.Name, err)
	}
	klog.FromContext(ctx).Info("Created ResourceClaimTemplate", "template", client.ObjectKeyFromObject(t))
	return true, "", nil
}

func (r *Reconciler) delete(ctx context.Context, t *resourceapi.ResourceClaimTemplate, why string) error {
	err := r.client.Delete(ctx, t, client.Preconditions{UID: &t.UID})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting ResourceClaimTemplate %s/%s: %w", t.Namespace, t.Name, err)
	}
	klog.FromContext(ctx).Info("Deleted ResourceClaimTemplate: "+why, "template", client.ObjectKeyFromObject(t))
	return nil
}

func ownedBy(t *resourceapi.ResourceClaimTemplate, s *gpuaas.GpuShape) bool {
	ref := metav1.GetControllerOf(t)
	return ref != nil && ref.Kind == gpuaas.GpuShapeKind && ref.UID == s.UID
}

// placeable counts the shape's instances that fit now; none while a part
// is missing.
func (r *Reconciler) placeable(ctx context.Context, s *gpuaas.GpuShape, parts shape.Parts, missing []string) (shape.Count, error) {
	drivers := otherDrivers(parts.Classes)
	if err := r.reachDrivers(ctx, s.Name, drivers); err != nil {
		return shape.Count{}, err
	}
	slicePtrs, err := r.slices(ctx, drivers)
	if err != nil {
		return shape.Count{}, err
	}
	if len(missing) > 0 {
		return r.matcher.Placeable(ctx, shape.Query{}, slicePtrs, nil, nil), nil
	}
	rules, err := r.drainRules(ctx)
	if err != nil {
		return shape.Count{}, err
	}
	var cl resourceapi.ResourceClaimList
	if err := r.client.List(ctx, &cl, client.UnsafeDisableDeepCopy); err != nil {
		return shape.Count{}, fmt.Errorf("listing ResourceClaims: %w", err)
	}
	claimPtrs := make([]*resourceapi.ResourceClaim, len(cl.Items))
	for i := range cl.Items {
		claimPtrs[i] = &cl.Items[i]
	}
	return r.matcher.Placeable(ctx, Query(s, parts), slicePtrs, claimPtrs, rules), nil
}

// drainRules are the cluster's DeviceTaintRules, none where they are not
// served.
func (r *Reconciler) drainRules(ctx context.Context) ([]*resourceapi.DeviceTaintRule, error) {
	if !r.drains {
		return nil, nil
	}
	var list resourceapi.DeviceTaintRuleList
	if err := r.client.List(ctx, &list); err != nil {
		return nil, fmt.Errorf("listing DeviceTaintRules: %w", err)
	}
	out := make([]*resourceapi.DeviceTaintRule, len(list.Items))
	for i := range list.Items {
		out[i] = &list.Items[i]
	}
	return out, nil
}

// reachDrivers tells the caches of other drivers' slices, if they are
// ours to tell, which drivers the shape reaches.
func (r *Reconciler) reachDrivers(ctx context.Context, shape string, drivers sets.Set[string]) error {
	if r.reach == nil {
		return nil
	}
	return r.reach(ctx, shape, drivers)
}

// slices are our driver's slices (the manager's cache) and, with
// WithForeignSlices, the other drivers' among drivers (every other one
// with AnyDriver).
func (r *Reconciler) slices(ctx context.Context, drivers sets.Set[string]) ([]*resourceapi.ResourceSlice, error) {
	var ours, theirs resourceapi.ResourceSliceList
	if err := r.client.List(ctx, &ours, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("listing ResourceSlices: %w", err)
	}
	if r.foreign != nil {
		if err := r.foreign.List(ctx, &theirs, client.UnsafeDisableDeepCopy); err != nil {
			return nil, fmt.Errorf("listing other drivers' ResourceSlices: %w", err)
		}
	}
	out := make([]*resourceapi.ResourceSlice, 0, len(ours.Items)+len(theirs.Items))
	for i := range ours.Items {
		out = append(out, &ours.Items[i])
	}
	for i := range theirs.Items {
		if s := &theirs.Items[i]; s.Spec.Driver != quota.DriverName && (drivers.Has(AnyDriver) || drivers.Has(s.Spec.Driver)) {
			out = append(out, s)
		}
	}
	return out, nil
}

// Query is the shape as shape.Placeable counts it, its requests' selectors
// those of the classes in parts.
func Query(s *gpuaas.GpuShape, parts shape.Parts) shape.Query {
	var q shape.Query
	q.Align, _ = shape.AlignmentAttribute(s.Spec.Alignment)
	for i := range s.Spec.Requests {
		req := &s.Spec.Requests[i]
		sr := shape.Request{Name: req.Name, All: req.IsAll(), Count: int(req.DeviceCount())}
		if dc := parts.Classes[req.ClassName()]; dc != nil {
			for _, sel := range dc.Spec.Selectors {
				if sel.CEL != nil {
					sr.Selectors = append(sr.Selectors, sel.CEL.Expression)
				}
			}
		}
		q.Requests = append(q.Requests, sr)
	}
	return q
}

func (r *Reconciler) updateStatus(ctx context.Context, s *gpuaas.GpuShape, status *gpuaas.GpuShapeStatus) error {
	if equality.Semantic.DeepEqual(&s.Status, status) {
		return nil
	}
	s.Status = *status
	err := r.client.Status().Update(ctx, s)
	if apierrors.IsConflict(err) {
		return nil // the newer object's event reconciles it again
	}
	if err != nil {
		return fmt.Errorf("updating status of GpuShape %s: %w", s.Name, err)
	}
	return nil
}

func condition(ok bool, reason, msg string) metav1.Condition {
	status := metav1.ConditionFalse
	if ok {
		status = metav1.ConditionTrue
	}
	return metav1.Condition{Type: gpuaas.ConditionReady, Status: status, Reason: reason, Message: msg}
}
