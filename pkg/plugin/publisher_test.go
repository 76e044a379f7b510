package plugin

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"

	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/inventory"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/prepare/preparetest"
)

// TestPublisherStoresEveryLayout (issue 57): the DRA library's own slice
// publisher (resourceslice, which kubeletplugin runs for the plugin)
// stores the pool the plugin builds for whole GPUs, dynamic MIG and
// time-slice replicas. On the 0.38 libraries (make plugin-next) it
// validates names first and refuses a bad pool without retrying, so this
// is where a name 1.38's publisher refuses would show; the last case shows
// it does refuse one (an attribute named with the driver's own domain).
func TestPublisherStoresEveryLayout(t *testing.T) {
	for name, cfg := range map[string]*configapi.NodeConfig{
		"whole":       {},
		"dynamic-mig": preparetest.DynamicAll(),
		"time-slice":  {Default: configapi.GpuMode{TimeSlicing: &configapi.TimeSlicingMode{Replicas: 4}}},
	} {
		t.Run(name, func(t *testing.T) {
			e := newTestEnvWith(t, "dgxh100", cfg)
			res := inventory.Resources(testNode, inventory.Discover(ktesting.NewLogger(t, ktesting.NewConfig()), e.Lib, cfg))
			stored, errs := publish(t, res)
			if len(errs) > 0 || stored != len(res.Pools[testNode].Slices) {
				t.Fatalf("stored %d of %d slices; publisher errors: %v", stored, len(res.Pools[testNode].Slices), errs)
			}
		})
	}
	t.Run("driver domain in an attribute name", func(t *testing.T) {
		e := newTestEnv(t, "dgxh100")
		res := inventory.Resources(testNode, inventory.Discover(ktesting.NewLogger(t, ktesting.NewConfig()), e.Lib, &configapi.NodeConfig{}))
		pool := res.Pools[testNode]
		i := slices.IndexFunc(pool.Slices, func(s resourceslice.Slice) bool { return len(s.Devices) > 0 })
		d := &pool.Slices[i].Devices[0]
		d.Attributes[resourceapi.QualifiedName(configapi.DriverName+"/type")] = d.Attributes["type"]
		stored, errs := publish(t, res)
		if preparetest.PublisherValidatesNames && (stored != 0 || len(errs) == 0) {
			t.Errorf("0.38's publisher stored %d slices of a pool naming an attribute %s/type (errors %v), want it refused", stored, configapi.DriverName, errs)
		}
		if !preparetest.PublisherValidatesNames && stored == 0 {
			t.Errorf("0.37's publisher stored nothing (errors %v)", errs)
		}
	})
}

// publish runs the library's publisher for the node on a fake API server
// until it has stored the pool or reported an error, and returns how many
// slices it stored and what it reported.
func publish(t *testing.T, res resourceslice.DriverResources) (int, []string) {
	t.Helper()
	client := fake.NewClientset()
	var n int
	var mu sync.Mutex
	// The fake API server does not generate names.
	client.PrependReactor("create", "resourceslices", func(act k8stesting.Action) (bool, runtime.Object, error) {
		s := act.(k8stesting.CreateAction).GetObject().(*resourceapi.ResourceSlice)
		if s.Name == "" {
			mu.Lock()
			n++
			s.Name = fmt.Sprintf("%s%d", s.GenerateName, n)
			mu.Unlock()
		}
		return false, nil, nil
	})
	var errs []string
	_, tctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(tctx)
	defer cancel()
	ctrl, err := resourceslice.StartController(ctx, resourceslice.Options{
		DriverName: configapi.DriverName, KubeClient: client, Resources: &res, SyncDelay: ptr.To(time.Duration(0)),
		Owner: &resourceslice.Owner{APIVersion: "v1", Kind: "Node", Name: testNode, UID: "node-uid"},
		ErrorHandler: func(_ context.Context, err error, msg string) {
			mu.Lock()
			defer mu.Unlock()
			errs = append(errs, msg+": "+err.Error())
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer ctrl.Stop()
	want := len(res.Pools[testNode].Slices)
	var stored int
	_ = wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
		list, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		stored = len(list.Items)
		mu.Lock()
		defer mu.Unlock()
		return stored == want || len(errs) > 0, nil
	})
	mu.Lock()
	defer mu.Unlock()
	return stored, append([]string(nil), errs...)
}
