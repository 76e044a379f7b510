package kueuemirror

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"
	"sigs.k8s.io/yaml"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/deviceclass"
	"github.com/gpuaas/gpu-dra-driver/pkg/kueue"
	"github.com/gpuaas/gpu-dra-driver/pkg/quota"
)

// MappingsConfigMap holds the deviceClassMappings rendered for Kueue,
// in the controller's namespace.
const MappingsConfigMap = "gpuaas-kueue-mappings"

// MappingsKey is the ConfigMap key of the rendered mappings.
const MappingsKey = "deviceClassMappings.yaml"

// kueueMappingsReconciler keeps MappingsConfigMap in line with the
// catalog: every enabled GpuProfile's DeviceClass under the Kueue resource
// it is charged as. Kueue reads its configuration at start only, so the
// ConfigMap is what an admin (or a GitOps pipeline) copies into Kueue's
// configuration; the controller logs when that is due. It also keeps the
// ResourceFlavor the ClusterQueues name (kueue.Flavor), once Kueue's CRDs
// are installed.
type kueueMappingsReconciler struct {
	profiles client.Reader // the cache
	// resync retries the ResourceFlavor, for Kueue installed later.
	resync time.Duration
	// direct writes the ConfigMap without a cluster-wide ConfigMap
	// informer (and the RBAC that would need).
	direct    client.Client
	namespace string
	// shapes: the GpuShape CRD is served, so the classes shapes name
	// are mapped too.
	shapes bool
	// prices tells what a profile's device costs, for the profiles pods
	// ask as extended resources; nil: none are transformed.
	prices Prices
}

// Prices tells what the published devices of a class cost in Kueue.
type Prices interface {
	// MaxMilliunits is the largest gpu-milliunits counter among the
	// published devices the selectors match (what Kueue's counter source
	// charges a claim template of the class); false while none is published.
	MaxMilliunits(ctx context.Context, selectors []string) (int64, bool, error)
}

// kueueMappingsKey is the one key every profile event maps to.
var kueueMappingsKey = reconcile.Request{NamespacedName: types.NamespacedName{Name: MappingsConfigMap}}

func (r *kueueMappingsReconciler) setup(mgr ctrl.Manager) error {
	every := handler.EnqueueRequestsFromMapFunc(
		func(context.Context, client.Object) []reconcile.Request { return []reconcile.Request{kueueMappingsKey} })
	b := ctrl.NewControllerManagedBy(mgr).Named("kueue-mappings").Watches(&gpuaas.GpuProfile{}, every)
	if r.shapes {
		b = b.Watches(&gpuaas.GpuShape{}, every, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
			// A class a shape names decides how it is charged, and may
			// come after the shape.
			Watches(&resourceapi.DeviceClass{}, every, builder.WithPredicates(predicate.Or(
				predicate.GenerationChangedPredicate{}, predicate.LabelChangedPredicate{})))
	}
	return b.
		// Once at start: an empty catalog has no profile event.
		WatchesRawSource(source.Func(func(_ context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
			q.Add(kueueMappingsKey)
			return nil
		})).
		Complete(r)
}

func (r *kueueMappingsReconciler) Reconcile(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
	var profiles gpuaas.GpuProfileList
	if err := r.profiles.List(ctx, &profiles); err != nil {
		return reconcile.Result{}, fmt.Errorf("listing GpuProfiles: %w", err)
	}
	var shapes gpuaas.GpuShapeList
	if r.shapes {
		if err := r.profiles.List(ctx, &shapes); err != nil {
			return reconcile.Result{}, fmt.Errorf("listing GpuShapes: %w", err)
		}
	}
	var classes resourceapi.DeviceClassList
	if r.shapes {
		if err := r.profiles.List(ctx, &classes); err != nil {
			return reconcile.Result{}, fmt.Errorf("listing DeviceClasses: %w", err)
		}
	}
	prices, unpriced, err := r.extendedPrices(ctx, profiles.Items)
	if err != nil {
		return reconcile.Result{}, err
	}
	rendered, err := renderKueueMappings(profiles.Items, shapes.Items, classes.Items, prices, unpriced)
	if err != nil {
		return reconcile.Result{}, err
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: r.namespace, Name: MappingsConfigMap}}
	op, err := controllerutil.CreateOrUpdate(ctx, r.direct, cm, func() error {
		cm.Data = map[string]string{MappingsKey: rendered}
		return nil
	})
	if err != nil {
		return reconcile.Result{}, fmt.Errorf("writing ConfigMap %s/%s: %w", r.namespace, MappingsConfigMap, err)
	}
	if op != controllerutil.OperationResultNone {
		klog.FromContext(ctx).Info("Kueue deviceClassMappings changed: copy them into Kueue's configuration and restart Kueue",
			"configMap", klog.KObj(cm), "profiles", len(profiles.Items))
	}
	return reconcile.Result{RequeueAfter: r.resync}, r.ensureFlavor(ctx)
}

// ensureFlavor creates the ResourceFlavor unless it exists. Without
// Kueue's CRDs there is nothing to do; the next profile change tries again.
func (r *kueueMappingsReconciler) ensureFlavor(ctx context.Context) error {
	flavor := kueue.Object("ResourceFlavor")
	err := r.direct.Get(ctx, types.NamespacedName{Name: kueue.Flavor}, flavor)
	switch {
	case err == nil:
		return nil
	case meta.IsNoMatchError(err):
		klog.FromContext(ctx).V(2).Info("Kueue is not installed: no ResourceFlavor to keep")
		return nil
	case !apierrors.IsNotFound(err):
		return fmt.Errorf("reading ResourceFlavor %s: %w", kueue.Flavor, err)
	}
	flavor = kueue.Object("ResourceFlavor")
	flavor.SetName(kueue.Flavor)
	flavor.SetLabels(map[string]string{"app.kubernetes.io/managed-by": "gpuaas-dra-controller"})
	if err := r.direct.Create(ctx, flavor); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating ResourceFlavor %s: %w", kueue.Flavor, err)
	}
	klog.FromContext(ctx).Info("Created Kueue ResourceFlavor", "name", kueue.Flavor)
	return nil
}

// extendedPrices prices the enabled profiles that pods may ask as an
// extended resource, each at its most expensive published device, as
// Kueue charges the class's templates; unpriced names those with no device
// published yet (the resync prices them once one is).
func (r *kueueMappingsReconciler) extendedPrices(ctx context.Context, profiles []gpuaas.GpuProfile) ([]kueue.ExtendedPrice, []string, error) {
	if r.prices == nil {
		return nil, nil, nil
	}
	var prices []kueue.ExtendedPrice
	var unpriced []string
	for i := range profiles {
		p := &profiles[i]
		ext := ptr.Deref(p.Spec.ExtendedResourceName, "")
		res, charged := kueue.ChargedAs(p)
		if ext == "" || !charged {
			continue
		}
		milli, ok, err := r.prices.MaxMilliunits(ctx, deviceclass.Selectors(&p.Spec.Selector))
		if err != nil {
			return nil, nil, fmt.Errorf("pricing GpuProfile %s for Kueue: %w", p.Name, err)
		}
		if !ok {
			unpriced = append(unpriced, fmt.Sprintf("%s (%s)", p.Name, ext))
			continue
		}
		prices = append(prices, kueue.ExtendedPrice{ExtendedResource: ext, Resource: res, Milliunits: milli})
	}
	return prices, unpriced, nil
}

// renderKueueMappings renders the enabled profiles' mappings, and those
// of the other classes shapes name (among classes), as the YAML of Kueue's
// resources section, with the transformations of the priced extended
// resources.
func renderKueueMappings(profiles []gpuaas.GpuProfile, shapes []gpuaas.GpuShape, classes []resourceapi.DeviceClass,
	prices []kueue.ExtendedPrice, unpriced []string) (string, error) {
	charges := make([]kueue.Charge, 0, len(profiles))
	names := make(map[string]bool, len(profiles))
	for i := range profiles {
		p := &profiles[i]
		names[p.Name] = true
		if res, ok := kueue.ChargedAs(p); ok {
			charges = append(charges, kueue.Charge{DeviceClass: p.Name, Resource: res})
		}
	}
	byName := make(map[string]*resourceapi.DeviceClass, len(classes))
	for i := range classes {
		byName[classes[i].Name] = &classes[i]
	}
	ours := func(class string) bool {
		dc := byName[class]
		return dc != nil && quota.ClassNamesDriver(dc, kueue.Driver)
	}
	charges = append(charges, kueue.ShapeCharges(shapes, names, ours)...)
	out, err := yaml.Marshal(kueue.Resources(charges, prices...))
	if err != nil {
		return "", fmt.Errorf("rendering Kueue's deviceClassMappings: %w", err)
	}
	head := "# resources: section of Kueue's Configuration (config.kueue.x-k8s.io/v1beta2),\n" +
		"# rendered by dra-controller from the GpuProfiles; see docs/kueue.md.\n"
	if len(prices) > 0 {
		head += "# The transformations need Kueue's manager started with --feature-gates=" + kueue.ExtendedResourceGate + "=false.\n"
	}
	if len(unpriced) > 0 {
		slices.Sort(unpriced)
		head += "# Not priced yet, no device published: " + strings.Join(unpriced, ", ") +
			"; until they are, Kueue does not admit pods asking these extended resources.\n"
	}
	return head + string(out), nil
}
