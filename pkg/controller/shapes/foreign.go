package shapes

import (
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/fields"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gpuaas/gpu-dra-driver/pkg/quota"
)

// ForeignSliceCache is how the shapes' own cache holds other drivers'
// ResourceSlices. The manager's cache, which every replica runs for the
// webhook, holds our driver's only (what is priced); the count of a
// shape's placeable instances is the one reader of another driver's
// devices (the NIC of a GPU+NIC slot), and it runs on the leader alone.
// Of each slice it keeps what the count reads (shape.Placeable): the spec
// of a slice on one node, and of a slice not on one node (all nodes, a node
// selector) neither devices nor counters, as the count skips it.
func ForeignSliceCache() cache.ByObject {
	return cache.ByObject{
		Field:     fields.OneTermNotEqualSelector(resourceapi.ResourceSliceSelectorDriver, quota.DriverName),
		Transform: trimForeignSlice,
	}
}

func trimForeignSlice(obj any) (any, error) {
	s, ok := obj.(*resourceapi.ResourceSlice)
	if !ok {
		return obj, nil // a tombstone: as it comes
	}
	s.ManagedFields, s.Labels, s.Annotations, s.OwnerReferences = nil, nil, nil, nil
	if s.Spec.NodeName == nil || *s.Spec.NodeName == "" {
		s.Spec.Devices, s.Spec.SharedCounters = nil, nil
	}
	return s, nil
}

// newForeignSliceCache is the cache of other drivers' slices, added to the
// manager: a bare cache is a leader-election runnable there, so only the
// leader, whose reconciler reads it, lists them.
func newForeignSliceCache(mgr ctrl.Manager) (cache.Cache, error) {
	c, err := cache.New(mgr.GetConfig(), cache.Options{
		HTTPClient: mgr.GetHTTPClient(), Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper(),
		ByObject: map[client.Object]cache.ByObject{&resourceapi.ResourceSlice{}: ForeignSliceCache()},
	})
	if err != nil {
		return nil, fmt.Errorf("creating the cache of other drivers' ResourceSlices: %w", err)
	}
	if err := mgr.Add(c); err != nil {
		return nil, fmt.Errorf("adding the cache of other drivers' ResourceSlices: %w", err)
	}
	return c, nil
}
