package controller

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	resourceapi "k8s.io/api/resource/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// cachedSlicesDesc is the number of ResourceSlices the manager's cache
// holds, by driver (issue 52): what a replica's memory grows with on a
// fleet. Only our driver's should be there (cacheOptions); a series of
// another driver means its slices are held, which took a replica from
// 81 MB to 171 MB with 500 of them. Counted from the cache at each scrape,
// so it says what the cache holds, not what it was configured to hold.
var cachedSlicesDesc = prometheus.NewDesc("gpuaas_controller_cached_resourceslices",
	"ResourceSlices in the controller's cache, by driver (only the controller's own driver is cached).",
	[]string{"driver"}, nil)

// cachedSlicesTimeout bounds one scrape's list of the cache: a cache not
// started yet (the list would wait for it) reports nothing instead.
const cachedSlicesTimeout = 2 * time.Second

// cachedSlices counts the ResourceSlices of the reader it was last given
// (the running manager's cache). It is registered once per process; a
// controller restarted in the same process (tests) gives it its own cache.
type cachedSlices struct {
	reader atomic.Pointer[client.Reader]
}

var cachedSlicesCollector = &cachedSlices{}

// use makes the collector count what r holds from now on.
func (c *cachedSlices) use(r client.Reader) { c.reader.Store(&r) }

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
	for driver, n := range slicesByDriver(list.Items) {
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
