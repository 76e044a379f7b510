package gpunode

import (
	"context"
	"fmt"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller/internal/kinds"
	"github.com/gpuaas/gpu-dra-driver/pkg/posture"
)

// Field indexes of the posture controller: each node's reconcile reads
// only its own slices and the claims allocated on it, not the cluster's.
const (
	// indexSlicePool indexes our driver's ResourceSlices by pool (= node).
	indexSlicePool = "gpuaas.posture.spec.pool.name"
	// indexClaimPools indexes ResourceClaims by the pools of our driver
	// their allocation results name.
	indexClaimPools = "gpuaas.posture.status.allocation.pools"
)

// postureResync re-reads every node now and then, to restore a GpuNode
// status someone edited; every real change arrives as an event.
const postureResync = 5 * time.Minute

// postureWorkers reconcile nodes in parallel: each is independent and
// cheap, and a cluster-wide change (a DeviceTaintRule without a pool)
// queues every node at once.
const postureWorkers = 4

// Setup adds the GpuNode controller to the manager: one GpuNode per node
// that publishes devices of our driver, its status the posture of each GPU
// (pkg/posture), plus the gpuaas_gpu_posture and gpuaas_node_posture
// metrics. Call it before the manager starts: it adds field indexes to the
// shared cache.
func Setup(ctx context.Context, mgr ctrl.Manager) error {
	logger := klog.FromContext(ctx)
	registerPostureMetrics()
	served, err := servesGpuNodes(ctx, mgr.GetRESTMapper())
	if err != nil {
		return err
	}
	if !served {
		// A watch on a kind the API does not serve never syncs and would
		// stop the manager; the rest of the controller works without it.
		logger.Error(nil, "The GpuNode CRD is not installed: GPU postures are not reported; install the chart's crds/ (helm upgrade skips them) and restart the controller")
		return nil
	}
	if err := indexPostureFields(ctx, mgr.GetFieldIndexer()); err != nil {
		return err
	}
	rules, err := kinds.Served(mgr.GetRESTMapper(), schema.GroupKind{Group: resourceapi.GroupName, Kind: "DeviceTaintRule"}, resourceapi.SchemeGroupVersion.Version)
	if err != nil {
		return err
	}
	if !rules {
		// resource.k8s.io/v1 DeviceTaintRules are GA in 1.37: on older
		// clusters a watch on them would never sync.
		logger.Info("resource.k8s.io/v1 DeviceTaintRules are not served; GPU postures ignore admins' drains")
	}
	c := mgr.GetClient()
	cs, err := kubernetes.NewForConfig(mgr.GetConfig())
	if err != nil {
		return fmt.Errorf("client for the cluster feature probe: %w", err)
	}
	features := newClusterFeatures(cs, c)
	if err := mgr.Add(features); err != nil {
		return fmt.Errorf("adding the cluster feature probe: %w", err)
	}
	r := &postureReconciler{client: c, rules: rules, resync: postureResync, now: time.Now, metrics: newPostureMetrics(), features: features}
	b := ctrl.NewControllerManagedBy(mgr).Named("gpunode").
		// Created or deleted by someone else: put it back or remove it.
		// Our own status writes change no generation and come back as
		// no event.
		For(&gpuaas.GpuNode{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&resourceapi.ResourceSlice{}, nodeEvents(slicePools)).
		Watches(&resourceapi.ResourceClaim{}, nodeEvents(claimPools), builder.WithPredicates(allocationChanged)).
		// The cluster feature probe's answer changed: every node reports it.
		WatchesRawSource(source.Channel(features.events, &handler.EnqueueRequestForObject{})).
		WithOptions(controller.Options{MaxConcurrentReconciles: postureWorkers})
	if rules {
		b = b.Watches(&resourceapi.DeviceTaintRule{}, nodeEvents(rulePools(c)))
	}
	if err := b.Complete(r); err != nil {
		return fmt.Errorf("setting up GpuNode controller: %w", err)
	}
	return nil
}

func indexPostureFields(ctx context.Context, idx client.FieldIndexer) error {
	if err := idx.IndexField(ctx, &resourceapi.ResourceSlice{}, indexSlicePool, slicePoolIndex); err != nil {
		return fmt.Errorf("indexing ResourceSlices by pool: %w", err)
	}
	if err := idx.IndexField(ctx, &resourceapi.ResourceClaim{}, indexClaimPools, claimPoolsIndex); err != nil {
		return fmt.Errorf("indexing ResourceClaims by allocated pool: %w", err)
	}
	return nil
}

// gpuNodeWait is how long setup waits for the GpuNode CRD to be served:
// ApplyCRDs may have created it a moment ago.
const gpuNodeWait = 15 * time.Second

func servesGpuNodes(ctx context.Context, m meta.RESTMapper) (bool, error) {
	gk := gpuaas.GroupVersion.WithKind(gpuaas.GpuNodeKind).GroupKind()
	return kinds.ServedWithin(ctx, m, gk, gpuaas.GroupVersion.Version, gpuNodeWait)
}

// postureReconciler keeps each node's GpuNode and posture metrics current.
// The request's name is the node's (its pool's) name.
type postureReconciler struct {
	client client.Client
	// rules: DeviceTaintRules are served and watched.
	rules   bool
	resync  time.Duration
	now     func() time.Time
	metrics *postureMetrics
	// features: what the cluster's API server lacks; nil reports nothing.
	features *clusterFeatures
}

func (r *postureReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	node := req.Name // controller-runtime's logger in ctx names it already
	slices, err := r.slicesOf(ctx, node)
	if err != nil {
		return reconcile.Result{}, err
	}
	if len(slices) == 0 {
		// The plugin is gone from the node (or the node is): nothing to
		// report, and a stale posture would mislead.
		r.metrics.forget(node)
		return reconcile.Result{}, r.deleteGpuNode(ctx, node)
	}
	claims, err := r.claimsOn(ctx, node)
	if err != nil {
		return reconcile.Result{}, err
	}
	rules, err := r.taintRules(ctx)
	if err != nil {
		return reconcile.Result{}, err
	}
	np := posture.Compute(node, slices, claims, rules)
	r.metrics.set(&np)
	status := np.Status()
	status.ClusterVersion, status.MissingFeatures = r.features.current()
	if err := r.writeStatus(ctx, node, status); err != nil {
		return reconcile.Result{}, err
	}
	return reconcile.Result{RequeueAfter: r.resync}, nil
}

func (r *postureReconciler) slicesOf(ctx context.Context, node string) ([]resourceapi.ResourceSlice, error) {
	var list resourceapi.ResourceSliceList
	if err := r.client.List(ctx, &list, client.MatchingFields{indexSlicePool: node}); err != nil {
		return nil, fmt.Errorf("listing ResourceSlices of node %s: %w", node, err)
	}
	return list.Items, nil
}

func (r *postureReconciler) claimsOn(ctx context.Context, node string) ([]resourceapi.ResourceClaim, error) {
	var list resourceapi.ResourceClaimList
	if err := r.client.List(ctx, &list, client.MatchingFields{indexClaimPools: node}); err != nil {
		return nil, fmt.Errorf("listing ResourceClaims allocated on node %s: %w", node, err)
	}
	return list.Items, nil
}

func (r *postureReconciler) taintRules(ctx context.Context) ([]resourceapi.DeviceTaintRule, error) {
	if !r.rules {
		return nil, nil
	}
	var list resourceapi.DeviceTaintRuleList
	if err := r.client.List(ctx, &list); err != nil {
		return nil, fmt.Errorf("listing DeviceTaintRules: %w", err)
	}
	return list.Items, nil
}

// writeStatus creates the node's GpuNode if needed and writes its status
// when it changed; ObservedTime moves only with a change, so an idle
// cluster costs no writes.
func (r *postureReconciler) writeStatus(ctx context.Context, node string, want gpuaas.GpuNodeStatus) error {
	var gn gpuaas.GpuNode
	err := r.client.Get(ctx, client.ObjectKey{Name: node}, &gn)
	switch {
	case apierrors.IsNotFound(err):
		gn = gpuaas.GpuNode{ObjectMeta: metav1.ObjectMeta{Name: node}}
		if err := r.client.Create(ctx, &gn); err != nil {
			return fmt.Errorf("creating GpuNode %s: %w", node, err)
		}
		klog.FromContext(ctx).Info("Created GpuNode")
	case err != nil:
		return fmt.Errorf("reading GpuNode %s: %w", node, err)
	}
	if sameStatus(&gn.Status, &want) {
		return nil
	}
	want.ObservedTime = &metav1.Time{Time: r.now()}
	gn.Status = want
	err = r.client.Status().Update(ctx, &gn)
	if apierrors.IsConflict(err) {
		return nil // the cache was behind; the newer object's event comes back here
	}
	if err != nil {
		return fmt.Errorf("updating status of GpuNode %s: %w", node, err)
	}
	klog.FromContext(ctx).V(2).Info("Updated GpuNode status", "posture", want.Posture, "reason", want.Reason)
	return nil
}

// sameStatus compares all but ObservedTime.
func sameStatus(have, want *gpuaas.GpuNodeStatus) bool {
	h, w := *have, *want
	h.ObservedTime, w.ObservedTime = nil, nil
	return equality.Semantic.DeepEqual(&h, &w)
}

func (r *postureReconciler) deleteGpuNode(ctx context.Context, node string) error {
	var gn gpuaas.GpuNode
	err := r.client.Get(ctx, client.ObjectKey{Name: node}, &gn)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading GpuNode %s: %w", node, err)
	}
	if err := r.client.Delete(ctx, &gn, client.Preconditions{UID: &gn.UID}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting GpuNode %s: %w", node, err)
	}
	klog.FromContext(ctx).Info("Deleted GpuNode: the node publishes no devices of the driver")
	return nil
}

// Index functions.

func slicePoolIndex(obj client.Object) []string {
	s, ok := obj.(*resourceapi.ResourceSlice)
	if !ok || s.Spec.Driver != posture.DriverName {
		return nil
	}
	return []string{s.Spec.Pool.Name}
}

func claimPoolsIndex(obj client.Object) []string {
	c, ok := obj.(*resourceapi.ResourceClaim)
	if !ok || c.Status.Allocation == nil {
		return nil
	}
	pools := sets.New[string]()
	for _, res := range c.Status.Allocation.Devices.Results {
		if res.Driver == posture.DriverName {
			pools.Insert(res.Pool)
		}
	}
	return sets.List(pools)
}

// Map functions: the nodes (pools) an object bears on.

func slicePools(_ context.Context, obj client.Object) []string { return slicePoolIndex(obj) }

func claimPools(_ context.Context, obj client.Object) []string { return claimPoolsIndex(obj) }

// rulePools maps a DeviceTaintRule to the pool it names or, without one,
// to every node that publishes our devices. A rule for another driver, or
// without a selector, taints none of ours.
func rulePools(c client.Reader) func(context.Context, client.Object) []string {
	return func(ctx context.Context, obj client.Object) []string {
		rule, ok := obj.(*resourceapi.DeviceTaintRule)
		if !ok || rule.Spec.DeviceSelector == nil {
			return nil
		}
		sel := rule.Spec.DeviceSelector
		if sel.Driver != nil && *sel.Driver != posture.DriverName {
			return nil
		}
		if sel.Pool != nil {
			return []string{*sel.Pool}
		}
		pools, err := publishingPools(ctx, c)
		if err != nil {
			// The resync catches up.
			klog.FromContext(ctx).Error(err, "Mapping a DeviceTaintRule to nodes", "deviceTaintRule", rule.Name)
			return nil
		}
		return pools
	}
}

// publishingPools are the pools (nodes) with slices of our driver.
func publishingPools(ctx context.Context, c client.Reader) ([]string, error) {
	var list resourceapi.ResourceSliceList
	if err := c.List(ctx, &list); err != nil {
		return nil, fmt.Errorf("listing ResourceSlices: %w", err)
	}
	pools := sets.New[string]()
	for i := range list.Items {
		pools.Insert(slicePoolIndex(&list.Items[i])...)
	}
	return sets.List(pools), nil
}

// allocationChanged passes a claim's creation and deletion, and updates
// that change its allocation: the rest of a claim's life (reservedFor,
// conditions) does not bear on any GPU's posture.
var allocationChanged = predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool {
		o, ok1 := e.ObjectOld.(*resourceapi.ResourceClaim)
		n, ok2 := e.ObjectNew.(*resourceapi.ResourceClaim)
		return !ok1 || !ok2 || !equality.Semantic.DeepEqual(o.Status.Allocation, n.Status.Allocation)
	},
}

// statusDelay coalesces bursts of slice and claim events into one
// reconcile of a node, as the catalog's status recount does.
const statusDelay = time.Second

// nodeEvents enqueues the nodes an object bears on, after statusDelay so a
// burst (a plugin republishing its slices, a job's claims allocated at
// once) is one reconcile per node. An update enqueues the nodes of the old
// object as well as the new: a claim deallocated, or a rule moved to
// another pool, frees the node it left.
func nodeEvents(pools func(context.Context, client.Object) []string) handler.EventHandler {
	type queue = workqueue.TypedRateLimitingInterface[reconcile.Request]
	add := func(ctx context.Context, q queue, objs ...client.Object) {
		for _, obj := range objs {
			for _, p := range pools(ctx, obj) {
				q.AddAfter(reconcile.Request{NamespacedName: client.ObjectKey{Name: p}}, statusDelay)
			}
		}
	}
	return handler.Funcs{
		CreateFunc:  func(ctx context.Context, e event.CreateEvent, q queue) { add(ctx, q, e.Object) },
		UpdateFunc:  func(ctx context.Context, e event.UpdateEvent, q queue) { add(ctx, q, e.ObjectOld, e.ObjectNew) },
		DeleteFunc:  func(ctx context.Context, e event.DeleteEvent, q queue) { add(ctx, q, e.Object) },
		GenericFunc: func(ctx context.Context, e event.GenericEvent, q queue) { add(ctx, q, e.Object) },
	}
}
