package shapes_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache/informertest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller/internal/testworld"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller/shapes"
	"github.com/gpuaas/gpu-dra-driver/pkg/quota"
)

const otherGPU = "gpu.example.com"

// sliceCache is a cache of the slices it was made with, synced once
// started.
type sliceCache struct {
	*informertest.FakeInformers
	slices  []resourceapi.ResourceSlice
	started chan struct{}
	done    context.Context // the context it was started with
	mu      *sync.Mutex
}

func (c *sliceCache) Start(ctx context.Context) error {
	c.mu.Lock()
	c.done = ctx
	c.mu.Unlock()
	close(c.started)
	<-ctx.Done()
	return nil
}

func (c *sliceCache) WaitForCacheSync(ctx context.Context) bool {
	select {
	case <-c.started:
		return true
	case <-ctx.Done():
		return false
	}
}

func (c *sliceCache) List(_ context.Context, list client.ObjectList, _ ...client.ListOption) error {
	list.(*resourceapi.ResourceSliceList).Items = slices.Clone(c.slices)
	return nil
}

// fakeCaches makes the caches as the API server would fill them from
// store (each driver's slices; every driver's but ours for AnyDriver) and
// remembers them by driver.
type fakeCaches struct {
	mu    sync.Mutex
	store []resourceapi.ResourceSlice
	made  map[string]*sliceCache
}

func (f *fakeCaches) newCache(driver string) (cache.Cache, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := &sliceCache{FakeInformers: &informertest.FakeInformers{}, started: make(chan struct{}), mu: &f.mu}
	for _, s := range f.store {
		if s.Spec.Driver == driver || driver == shapes.AnyDriver && s.Spec.Driver != quota.DriverName {
			c.slices = append(c.slices, s)
		}
	}
	f.made[driver] = c
	return c, nil
}

// otherSlices moves the world's slices of other drivers out of c, as the
// manager's cache holds ours only, and adds one of another GPU driver.
func otherSlices(t *testing.T, c client.Client) []resourceapi.ResourceSlice {
	var all resourceapi.ResourceSliceList
	if err := c.List(t.Context(), &all); err != nil {
		t.Fatal(err)
	}
	var out []resourceapi.ResourceSlice
	for i := range all.Items {
		if s := &all.Items[i]; s.Spec.Driver != quota.DriverName {
			out = append(out, *s.DeepCopy())
			if err := c.Delete(t.Context(), s); err != nil {
				t.Fatal(err)
			}
		}
	}
	gpu := testworld.ResourceSlice("node-x", testworld.WholeGPU(0))
	gpu.Name, gpu.Spec.Driver = "node-x-gpu-example-com", otherGPU
	return append(out, *gpu)
}

// TestLeaderCachesOnlyTheDriversShapesReach (issue 52): the leader caches
// another driver's ResourceSlices only while a shape's class reaches that
// driver, and only that driver's: the slot shape's NIC class pins
// nic.example.com, so gpu.example.com's slices (2,000 of them were 150 MB
// of the controller's heap, every one cached though no shape could use
// it) are never listed; once the shape is gone, nothing of another driver
// is cached. The count still finds the slot's NIC.
func TestLeaderCachesOnlyTheDriversShapesReach(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	c := world(t, slotShape())
	fake := &fakeCaches{store: otherSlices(t, c), made: map[string]*sliceCache{}}
	f := shapes.NewForeignCachesWith(fake.newCache)
	go func() { _ = f.Start(ctx) }()
	r := shapes.NewReconciler(c, c, time.Minute).WithForeignCaches(f)
	reconcileAndGet := func(name string) *gpuaas.GpuShape {
		t.Helper()
		if _, err := r.Reconcile(ctx, reconcile.Request{NamespacedName: types.NamespacedName{Name: name}}); err != nil {
			t.Fatal(err)
		}
		var s gpuaas.GpuShape
		if err := c.Get(ctx, types.NamespacedName{Name: name}, &s); client.IgnoreNotFound(err) != nil {
			t.Fatal(err)
		}
		return &s
	}
	if s := reconcileAndGet("h100-slot"); s.Status.Placeable != 1 {
		t.Errorf("slot placeable %d (%q); want node-a's GPU and NIC on r0", s.Status.Placeable, s.Status.PlaceableMessage)
	}
	if got := f.Drivers(); !slices.Equal(got, []string{nicDriver}) {
		t.Fatalf("caching the slices of %q; want only %s, which the slot's NIC class pins", got, nicDriver)
	}
	if err := c.Delete(ctx, &gpuaas.GpuShape{ObjectMeta: metav1.ObjectMeta{Name: "h100-slot"}}); err != nil {
		t.Fatal(err)
	}
	reconcileAndGet("h100-slot")
	if got := f.Drivers(); len(got) != 0 {
		t.Errorf("caching the slices of %q with no shape left; want none", got)
	}
	fake.mu.Lock()
	defer fake.mu.Unlock()
	if nicCache := fake.made[nicDriver]; nicCache == nil || nicCache.done == nil || nicCache.done.Err() == nil {
		t.Errorf("the cache of %s's slices still runs after its last shape went", nicDriver)
	}
	if _, ok := fake.made[otherGPU]; ok {
		t.Errorf("a cache of %s's slices was made; no shape reaches it", otherGPU)
	}
}
