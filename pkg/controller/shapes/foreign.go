package shapes

import (
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/fields"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	"github.com/gpuaas/gpu-dra-driver/pkg/controller/slicecache"
	"github.com/gpuaas/gpu-dra-driver/pkg/quota"
)

// ForeignSliceCache is how the shapes' own caches hold other drivers'
// ResourceSlices: those of driver, or of every driver but ours for
// AnyDriver. The manager's cache, which every replica runs for the
// webhook, holds our driver's only (what is priced); the count of a
// shape's placeable instances is the one reader of another driver's
// devices (the NIC of a GPU+NIC slot), and it runs on the leader alone,
// for the drivers the shapes' classes reach (foreignCaches).
// Of each slice it keeps what the count reads (shape.Placeable): the spec
// of a slice on one node, and of a slice not on one node (all nodes, a node
// selector) neither devices nor counters, as the count skips it.
func ForeignSliceCache(driver string) cache.ByObject {
	field := fields.OneTermEqualSelector(resourceapi.ResourceSliceSelectorDriver, driver)
	if driver == AnyDriver {
		field = fields.OneTermNotEqualSelector(resourceapi.ResourceSliceSelectorDriver, quota.DriverName)
	}
	return cache.ByObject{Field: field, Transform: trimForeignSlice}
}

// trimForeignSlice keeps of another driver's slice what the count reads,
// held as the manager's cache holds ours (slicecache).
func trimForeignSlice(obj any) (any, error) {
	s, ok := obj.(*resourceapi.ResourceSlice)
	if !ok {
		return obj, nil // a tombstone: as it comes
	}
	s.ManagedFields, s.Labels, s.Annotations, s.OwnerReferences = nil, nil, nil, nil
	if s.Spec.NodeName == nil || *s.Spec.NodeName == "" {
		s.Spec.Devices, s.Spec.SharedCounters = nil, nil
	}
	return slicecache.Transform(s)
}
