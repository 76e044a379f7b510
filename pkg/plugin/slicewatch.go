package plugin

import (
	"context"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
)

// republishAfter is how long a deletion of one of the node's slices waits
// before the plugin publishes again: the slice controller's own informer
// must have seen the deletion, or the sync finds nothing missing.
const republishAfter = time.Second

// watchOwnSlices publishes again soon after one of the node's slices of
// this driver is deleted by someone else. A starting kubelet deletes every
// slice of its node; kubeletplugin's slice controller recreates them only
// after its SyncDelay (30 s, not an option of kubeletplugin), and until
// then the node offers no GPU: measured 7 to 14 s after each kubelet
// restart, every node upgrade. Publishing makes the controller sync at
// once. Deletions of its own (fewer slices) cause a sync that changes
// nothing.
func watchOwnSlices(ctx context.Context, client kubernetes.Interface, node string, republish func(context.Context)) {
	logger := klog.FromContext(ctx)
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.AndSelectors(
			fields.OneTermEqualSelector(resourceapi.ResourceSliceSelectorNodeName, node),
			fields.OneTermEqualSelector(resourceapi.ResourceSliceSelectorDriver, configapi.DriverName),
		).String()
	}))
	deleted := make(chan struct{}, 1)
	_, err := factory.Resource().V1().ResourceSlices().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if s, ok := obj.(*resourceapi.ResourceSlice); ok {
				logger.V(2).Info("ResourceSlice of this node deleted; publishing again", "slice", klog.KObj(s))
			}
			select {
			case deleted <- struct{}{}:
			default: // one republish covers every deletion before it
			}
		},
	})
	if err != nil {
		logger.Error(err, "Watching this node's ResourceSlices: a deleted slice comes back only at the slice controller's next sync")
		return
	}
	factory.Start(ctx.Done())
	go func() {
		defer factory.Shutdown()
		for {
			select {
			case <-ctx.Done():
				return
			case <-deleted:
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(republishAfter):
			}
			select {
			case <-deleted: // deleted while waiting: this publish covers it
			default:
			}
			republish(ctx)
		}
	}()
}
