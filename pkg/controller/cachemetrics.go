package controller

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	resourceapi "k8s.io/api/resource/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// cachedSlicesDesc is the number of ResourceSlices the controller's caches
// hold, by driver (issue 52): what a replica's memory grows with on a
// fleet. The manager's cache holds only our driver's (cacheOptions); the
// leader's shapes' caches those of the drivers a GpuShape's classes reach
// (shapes.Setup). Any other driver's series means its slices are held,
// which took a replica from 81 MB to 171 MB with 500 of them. Both are
// counted: the shapes' were not, and the fleet benchmark reported 400
// slices cached while the leader held 2,000 more, 150 MB. Counted from the
// caches at each scrape, so it says what they hold, not what they were
// configured to hold.
var cachedSlicesDesc = prometheus.NewDesc("gpuaas_controller_cached_resourceslices",
	"ResourceSlices in the controller's caches, by driver (the controller's own driver's, and on the leader those of the drivers a GpuShape reaches).",
	[]string{"driver"}, nil)

// cachedSlicesTimeout bounds one scrape's list of the cache: a cache not
// started yet (the list would wait for it) reports nothing instead.
const cachedSlicesTimeout = 2 * time.Second

// cachedSlices counts the ResourceSlices of the readers it was last given
// (the running manager's cache, the shapes' caches of other drivers'
// slices). It is registered once per process; a controller restarted in
// the same process (tests) gives it its own caches.
type cachedSlices struct {
	reader, shapes atomic.Pointer[client.Reader]
}

var cachedSlicesCollector = &cachedSlices{}

// use makes the collector count what r holds from now on, and nothing of
// the shapes' caches until useShapes.
func (c *cachedSlices) use(r client.Reader) {
	c.reader.Store(&r)
	c.shapes.Store(nil)
}

// useShapes adds what the shapes' caches hold (nil: none) to the count.
func (c *cachedSlices) useShapes(r client.Reader) {
	if r != nil {
		c.shapes.Store(&r)
	}
}

func (c *cachedSlices) Describe(ch chan<- *prometheus.Desc) { ch <- cachedSlicesDesc }

func (c *cachedSlices) Collect(ch chan<- prometheus.Metric) {
	r := c.reader.Load()
	if r == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), cachedSlicesTimeout)
	defer cancel()
	var list resourceapi.ResourceSliceList
	// Read only: the cache's own objects, not copies of thousands.
	if err := (*r).List(ctx, &list, client.UnsafeDisableDeepCopy); err != nil {
		return
	}
	items := list.Items
	if s := c.shapes.Load(); s != nil {
		var theirs resourceapi.ResourceSliceList
		if err := (*s).List(ctx, &theirs, client.UnsafeDisableDeepCopy); err != nil {
			return
		}
		items = append(items, theirs.Items...)
	}
	for driver, n := range slicesByDriver(items) {
		ch <- prometheus.MustNewConstMetric(cachedSlicesDesc, prometheus.GaugeValue, float64(n), driver)
	}
}

func slicesByDriver(items []resourceapi.ResourceSlice) map[string]int {
	out := map[string]int{}
	for i := range items {
		out[items[i].Spec.Driver]++
	}
	return out
}
