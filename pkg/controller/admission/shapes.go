package admission

import (
	"context"
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/quota"
	"github.com/gpuaas/gpu-dra-driver/pkg/shape"
)

// WatchShapes has the accountant charge every claim the instances of each
// GpuShape it holds (shape.Instances), against the shape limits of
// TenantQuotas (limits.shapes). It is called only where
// the GpuShape CRD is served: without it there are no shapes to count.
// Only a shape's spec changes what a claim is an instance of, so its
// status writes (the placeable count, every second or so) leave the
// catalog, and every claim's price, alone.
func WatchShapes(ctx context.Context, c cache.Cache, acct *Accountant) error {
	inf, err := c.GetInformer(ctx, &gpuaas.GpuShape{})
	if err != nil {
		return fmt.Errorf("getting informer for GpuShapes: %w", err)
	}
	_, err = inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { acct.InvalidateCatalog() },
		UpdateFunc: func(oldObj, newObj any) {
			o, ok1 := oldObj.(*gpuaas.GpuShape)
			s, ok2 := newObj.(*gpuaas.GpuShape)
			if !ok1 || !ok2 || o.Generation != s.Generation {
				acct.InvalidateCatalog()
			}
		},
		DeleteFunc: func(any) { acct.InvalidateCatalog() },
	})
	if err != nil {
		return fmt.Errorf("watching GpuShapes: %w", err)
	}
	acct.countShapes.Store(true)
	acct.InvalidateCatalog()
	return nil
}

// shapesOf is the test the pricer charges shape instances by: how many
// instances of each shape the claim holds (shape.Instances), however its
// requests are named, ordered, split, repeated or wrapped in
// firstAvailable. Only the spec decides; labels, annotations and names are
// the tenant's to write and prove nothing, so a claim written by hand to a
// shape's spec is one of it, and so is one rewritten to slip past the cap.
func shapesOf(shapes []gpuaas.GpuShape) quota.ShapesOf {
	if len(shapes) == 0 {
		return nil
	}
	return func(spec *resourceapi.ResourceClaimSpec) map[string]int64 {
		var out map[string]int64
		for i := range shapes {
			n := shape.Instances(&shapes[i], spec)
			if n == 0 {
				continue
			}
			if out == nil {
				out = map[string]int64{}
			}
			out[shapes[i].Name] = n
		}
		return out
	}
}
