package shapes

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
)

// foreignCaches holds other drivers' ResourceSlices for the shapes' counts,
// on the leader, and only those of the drivers some shape's classes reach
// (otherDrivers): one cache per driver, started when a shape first reaches
// it and stopped when none does. Before (issue 52), the leader cached every
// other driver's node-local slices whole whether or not any shape could
// use them: 2,000 slices of 32 devices were 150 MB of its heap, and the
// chart's limit is 256 Mi. A class that pins no driver makes it cache
// every other driver's slices (AnyDriver), as before.
type foreignCaches struct {
	// newCache makes the (unstarted) cache of driver's slices.
	newCache func(driver string) (cache.Cache, error)
	// events has an event when a cached slice changed: the shapes'
	// controller recounts on it (a pending one stands for later ones,
	// as the recount reads the caches, not the event).
	events chan event.GenericEvent
	// started is closed by Start, which sets base: the caches run until
	// it is done (the leader's term).
	started chan struct{}
	base    context.Context

	// reaching serializes reach, which starts caches without holding mu,
	// so a List (a scrape of the metrics) never waits for a cache to sync.
	reaching sync.Mutex
	mu       sync.Mutex
	reached  map[string]sets.Set[string] // by shape
	running  map[string]*driverCache     // by driver
}

type driverCache struct {
	c    cache.Cache
	stop context.CancelFunc
}

func newForeignCaches(mgr ctrl.Manager) (*foreignCaches, error) {
	f := newForeignCachesWith(func(driver string) (cache.Cache, error) {
		return cache.New(mgr.GetConfig(), cache.Options{
			HTTPClient: mgr.GetHTTPClient(), Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper(),
			ByObject: map[client.Object]cache.ByObject{&resourceapi.ResourceSlice{}: ForeignSliceCache(driver)},
		})
	})
	// A runnable without NeedLeaderElection is the leader's: only the
	// leader, whose reconciler reads them, lists other drivers' slices.
	if err := mgr.Add(f); err != nil {
		return nil, fmt.Errorf("adding the caches of other drivers' ResourceSlices: %w", err)
	}
	return f, nil
}

func newForeignCachesWith(newCache func(driver string) (cache.Cache, error)) *foreignCaches {
	return &foreignCaches{
		newCache: newCache, events: make(chan event.GenericEvent, 1), started: make(chan struct{}),
		reached: map[string]sets.Set[string]{}, running: map[string]*driverCache{},
	}
}

// Start runs the caches until ctx is done (theirs are derived from it).
func (f *foreignCaches) Start(ctx context.Context) error {
	f.base = ctx
	close(f.started)
	<-ctx.Done()
	return nil
}

// Drivers are the drivers whose slices are cached now, sorted.
func (f *foreignCaches) Drivers() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Sorted(maps.Keys(f.running))
}

// reach records the other drivers the shape's count reads (none for a
// shape deleted), starts the caches of the drivers now reached, waiting
// for them to list, and stops those no shape reaches any longer.
func (f *foreignCaches) reach(ctx context.Context, shape string, drivers sets.Set[string]) error {
	select {
	case <-f.started:
	case <-ctx.Done():
		return fmt.Errorf("waiting for the caches of other drivers' slices to start: %w", ctx.Err())
	}
	f.reaching.Lock()
	defer f.reaching.Unlock()
	for _, d := range f.record(ctx, shape, drivers) {
		dc, err := f.start(ctx, d)
		if err != nil {
			return err
		}
		f.mu.Lock()
		f.running[d] = dc
		f.mu.Unlock()
		klog.FromContext(ctx).Info("Caching another driver's ResourceSlices for the shapes that reach it", "driver", d)
	}
	return nil
}

// record notes the drivers the shape reaches, stops the caches of drivers
// no shape reaches, and returns the drivers reached without a cache.
func (f *foreignCaches) record(ctx context.Context, shape string, drivers sets.Set[string]) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if drivers.Len() == 0 {
		delete(f.reached, shape)
	} else {
		f.reached[shape] = drivers
	}
	want := sets.New[string]()
	for _, d := range f.reached {
		want = want.Union(d)
	}
	if want.Has(AnyDriver) { // one cache holds them all
		want = sets.New(AnyDriver)
	}
	for d, dc := range f.running {
		if !want.Has(d) {
			dc.stop()
			delete(f.running, d)
			klog.FromContext(ctx).Info("Stopped caching another driver's ResourceSlices: no shape reaches it", "driver", d)
		}
	}
	var missing []string
	for _, d := range sets.List(want) {
		if _, ok := f.running[d]; !ok {
			missing = append(missing, d)
		}
	}
	return missing
}

// start runs the cache of driver's slices and waits until it has listed
// them.
//
//nolint:contextcheck // the cache outlives the reconcile that starts it: it runs for the leader's term (base)
func (f *foreignCaches) start(ctx context.Context, driver string) (*driverCache, error) {
	c, err := f.newCache(driver)
	if err != nil {
		return nil, fmt.Errorf("creating the cache of %q's ResourceSlices: %w", driver, err)
	}
	run, stop := context.WithCancel(f.base)
	go func() {
		if err := c.Start(run); err != nil {
			klog.FromContext(run).Error(err, "The cache of another driver's ResourceSlices stopped", "driver", driver)
		}
	}()
	inf, err := c.GetInformer(ctx, &resourceapi.ResourceSlice{})
	if err == nil {
		_, err = inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
			AddFunc:    func(any) { f.changed() },
			UpdateFunc: func(any, any) { f.changed() },
			DeleteFunc: func(any) { f.changed() },
		})
	}
	if err == nil && !c.WaitForCacheSync(ctx) {
		err = ctx.Err()
	}
	if err != nil {
		stop()
		return nil, fmt.Errorf("starting the cache of %q's ResourceSlices: %w", driver, err)
	}
	return &driverCache{c: c, stop: stop}, nil
}

// changed tells the shapes' controller that a cached slice changed; an
// event already waiting stands for this one.
func (f *foreignCaches) changed() {
	select {
	case f.events <- event.GenericEvent{Object: &resourceapi.ResourceSlice{}}:
	default:
	}
}

// Get is not served: the count lists.
func (f *foreignCaches) Get(context.Context, client.ObjectKey, client.Object, ...client.GetOption) error {
	return fmt.Errorf("the caches of other drivers' ResourceSlices serve List only")
}

// List lists the slices of every cache running (into a
// *resourceapi.ResourceSliceList), as the caches hold them.
func (f *foreignCaches) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	out, ok := list.(*resourceapi.ResourceSliceList)
	if !ok {
		return fmt.Errorf("the caches of other drivers' ResourceSlices list ResourceSlices, not %T", list)
	}
	f.mu.Lock()
	running := maps.Clone(f.running)
	f.mu.Unlock()
	out.Items = out.Items[:0]
	for _, d := range slices.Sorted(maps.Keys(running)) {
		var l resourceapi.ResourceSliceList
		if err := running[d].c.List(ctx, &l, opts...); err != nil {
			return fmt.Errorf("listing %q's ResourceSlices: %w", d, err)
		}
		out.Items = append(out.Items, l.Items...)
	}
	return nil
}
