package plugin

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
)

// Issue 39: a starting kubelet deletes its node's slices, and they came
// back only at the slice controller's next sync (up to 30 s; 7 to 14 s
// measured), the node offering nothing meanwhile. The plugin publishes
// again after a deletion now, once for a burst of them.
func TestDeletedSliceIsPublishedAgain(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	slices := []*resourceapi.ResourceSlice{nodeSlice("node-a-gpu-0"), nodeSlice("node-a-gpu-1")}
	client := fake.NewClientset(slices[0], slices[1])
	var published atomic.Int32
	watchOwnSlices(ctx, client, "node-a", func(context.Context) { published.Add(1) })

	// A deletion before the informer watches is not seen as one.
	err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		for _, a := range client.Actions() {
			if a.GetVerb() == "watch" && a.GetResource().Resource == "resourceslices" {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatal("the plugin does not watch its slices")
	}
	if n := published.Load(); n != 0 {
		t.Fatalf("published %d times before any slice was deleted", n)
	}
	for _, s := range slices {
		if err := client.ResourceV1().ResourceSlices().Delete(ctx, s.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return published.Load() > 0, nil
	})
	if err != nil {
		t.Fatal("the node's slices were deleted and the plugin did not publish again")
	}
	time.Sleep(2 * republishAfter)
	if n := published.Load(); n != 1 {
		t.Errorf("two slices deleted at once: published %d times, want once", n)
	}
}

func nodeSlice(name string) *resourceapi.ResourceSlice {
	return &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourceapi.ResourceSliceSpec{Driver: configapi.DriverName, NodeName: ptr.To("node-a"),
			Pool: resourceapi.ResourcePool{Name: "node-a", ResourceSliceCount: 2}},
	}
}
