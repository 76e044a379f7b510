package catalog

import (
	"context"
	"fmt"
	"time"

	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
)

// ReleaseFinalizers is the chart's pre-delete hook (dra-controller
// --release-finalizers): the controller goes away with the release, so no
// GpuProfile may keep a finalizer only it would remove, or helm uninstall
// leaves the catalog's profiles stuck "being deleted" and a reinstall
// fails on them. Each profile loses the finalizer and is marked released,
// so the controller still running during the uninstall does not add it
// back.
func ReleaseFinalizers(ctx context.Context, c client.Client) error {
	n, err := releaseFinalizers(ctx, c, time.Now())
	if err != nil {
		return err
	}
	klog.FromContext(ctx).Info("Released GpuProfiles for uninstall", "profiles", n)
	return nil
}

func releaseFinalizers(ctx context.Context, c client.Client, now time.Time) (int, error) {
	var profiles gpuaas.GpuProfileList
	if err := c.List(ctx, &profiles); err != nil {
		return 0, fmt.Errorf("listing GpuProfiles: %w", err)
	}
	for i := range profiles.Items {
		p := &profiles.Items[i]
		patch := client.MergeFrom(p.DeepCopy())
		controllerutil.RemoveFinalizer(p, gpuaas.DrainFinalizer)
		if p.Annotations == nil {
			p.Annotations = map[string]string{}
		}
		p.Annotations[gpuaas.ReleasedAnnotation] = now.UTC().Format(time.RFC3339)
		if err := c.Patch(ctx, p, patch); err != nil {
			return i, fmt.Errorf("releasing GpuProfile %s: %w", p.Name, err)
		}
	}
	return len(profiles.Items), nil
}
