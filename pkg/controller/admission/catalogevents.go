package admission

import (
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/quota"
)

// CatalogHandler calls changed on the events of obj's kind (a
// ResourceSlice, DeviceClass or GpuProfile) that can move a price, and
// only on those (issues 52 and 55): each call throws away the pricing
// snapshot, its pricer's memo and every claim's cached charge, so the next
// admission re-prices every claim of its cohort. The webhook's
// matchCondition sync shares it (WatchForeignClasses): foreignness is the
// pricer's verdict, moved by the same changes.
//
//   - A ResourceSlice of another driver never: the inventory holds our
//     driver's devices only (quota.NewInventory). One of ours on add and
//     delete, and on an update that changes what the inventory reads: the
//     pool (name, generation, slice count), the node, the shared counters
//     and the devices except their taints, which no price reads (a health
//     taint, set and cleared by the plugin, moved every price).
//   - A GpuProfile on add, delete, and an update of its spec (generation),
//     labels, annotations or deletion: not on its status, which the
//     profile reconciler writes about a second after any allocation.
//   - A DeviceClass on add, delete, and an update of its spec, labels (the
//     pricer reads gpuaas.ProfileLabel), annotations or deletion.
func CatalogHandler(obj client.Object, changed func()) toolscache.ResourceEventHandlerFuncs {
	f := filterFor(obj)
	return toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if f.priced(obj) {
				changed()
			}
		},
		UpdateFunc: func(oldObj, newObj any) {
			if f.updateMoved(oldObj, newObj) {
				changed()
			}
		},
		DeleteFunc: func(obj any) {
			if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if f.priced(obj) {
				changed()
			}
		},
	}
}

// catalogFilter is which objects of a kind are priced at all, and which
// updates of them move a price.
type catalogFilter struct {
	priced func(any) bool
	moved  func(oldObj, newObj any) bool
}

func filterFor(obj client.Object) catalogFilter {
	f := catalogFilter{priced: func(any) bool { return true }, moved: func(_, _ any) bool { return true }}
	switch obj.(type) {
	case *resourceapi.ResourceSlice:
		f.priced, f.moved = sliceIsOurs, sliceChangedPrices
	case *gpuaas.GpuProfile:
		f.moved = profileChangedPrices
	case *resourceapi.DeviceClass:
		f.moved = classChangedPrices
	}
	return f
}

func (f catalogFilter) updateMoved(oldObj, newObj any) bool {
	return (f.priced(oldObj) || f.priced(newObj)) && f.moved(oldObj, newObj)
}

// sliceIsOurs: a slice of our driver, or an object that is not a slice
// (which no handler should get; taken as a change, to be safe).
func sliceIsOurs(obj any) bool {
	s, ok := obj.(*resourceapi.ResourceSlice)
	return !ok || s.Spec.Driver == quota.DriverName
}

// sliceChangedPrices compares what the inventory reads of two versions
// of a slice.
func sliceChangedPrices(oldObj, newObj any) bool {
	o, ok1 := oldObj.(*resourceapi.ResourceSlice)
	n, ok2 := newObj.(*resourceapi.ResourceSlice)
	if !ok1 || !ok2 {
		return true
	}
	return !equality.Semantic.DeepEqual(pricedSpec(&o.Spec), pricedSpec(&n.Spec))
}

// pricedSpec is a slice's spec without its devices' taints. The devices
// are copied one level deep: Taints is replaced, nothing under it written.
func pricedSpec(spec *resourceapi.ResourceSliceSpec) resourceapi.ResourceSliceSpec {
	out := *spec
	out.Devices = make([]resourceapi.Device, len(spec.Devices))
	for i := range spec.Devices {
		out.Devices[i] = spec.Devices[i]
		out.Devices[i].Taints = nil
	}
	return out
}

func profileChangedPrices(oldObj, newObj any) bool {
	o, ok1 := oldObj.(*gpuaas.GpuProfile)
	n, ok2 := newObj.(*gpuaas.GpuProfile)
	if !ok1 || !ok2 {
		return true
	}
	return o.Generation != n.Generation || !equality.Semantic.DeepEqual(o.Spec, n.Spec) ||
		o.DeletionTimestamp.IsZero() != n.DeletionTimestamp.IsZero() ||
		!equality.Semantic.DeepEqual(o.Labels, n.Labels) || !equality.Semantic.DeepEqual(o.Annotations, n.Annotations)
}

func classChangedPrices(oldObj, newObj any) bool {
	o, ok1 := oldObj.(*resourceapi.DeviceClass)
	n, ok2 := newObj.(*resourceapi.DeviceClass)
	if !ok1 || !ok2 {
		return true
	}
	return !equality.Semantic.DeepEqual(o.Spec, n.Spec) || o.DeletionTimestamp.IsZero() != n.DeletionTimestamp.IsZero() ||
		!equality.Semantic.DeepEqual(o.Labels, n.Labels) || !equality.Semantic.DeepEqual(o.Annotations, n.Annotations)
}

// PricesMoved is CatalogHandler's filter as a predicate, for a reconciler
// whose work is prices (the TenantQuota's usage): a health taint on one
// slice queued every TenantQuota.
func PricesMoved(obj client.Object) predicate.Funcs {
	f := filterFor(obj)
	return predicate.Funcs{
		CreateFunc:  func(e event.CreateEvent) bool { return f.priced(e.Object) },
		UpdateFunc:  func(e event.UpdateEvent) bool { return f.updateMoved(e.ObjectOld, e.ObjectNew) },
		DeleteFunc:  func(e event.DeleteEvent) bool { return f.priced(e.Object) },
		GenericFunc: func(event.GenericEvent) bool { return true },
	}
}
