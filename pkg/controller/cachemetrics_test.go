package controller

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/gpuaas/gpu-dra-driver/pkg/controller/internal/testworld"
)

// TestCachedSlicesMetric: the collector counts what the reader it was
// given holds, by driver, so a scrape of a running controller shows
// whether another driver's slices are in its cache (the e2e test
// TestControllerCachesOnlyOurSlices reads it from the binary).
func TestCachedSlicesMetric(t *testing.T) {
	s, err := Scheme()
	if err != nil {
		t.Fatal(err)
	}
	ours := testworld.ResourceSlice("node-a", testworld.WholeGPU(0))
	other := testworld.ResourceSlice("node-b")
	other.Spec.Driver = "gpu.example.com"
	c := &cachedSlices{}
	if n := testutil.CollectAndCount(c); n != 0 {
		t.Errorf("%d series before a cache is given, want 0", n)
	}
	c.use(fake.NewClientBuilder().WithScheme(s).WithObjects(ours, other).Build())
	want := `
# HELP gpuaas_controller_cached_resourceslices ResourceSlices in the controller's caches, by driver (the controller's own driver's, and on the leader those of the drivers a GpuShape reaches).
# TYPE gpuaas_controller_cached_resourceslices gauge
gpuaas_controller_cached_resourceslices{driver="gpu.example.com"} 1
gpuaas_controller_cached_resourceslices{driver="` + testworld.Driver + `"} 1
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
}

// TestCachedSlicesMetricCountsTheShapesCaches (issue 52): the leader's
// caches of other drivers' slices, for the shapes, are counted with the
// manager's: they were not, and the fleet benchmark reported 400 slices
// cached while the leader held 2,000 of another driver (150 MB).
func TestCachedSlicesMetricCountsTheShapesCaches(t *testing.T) {
	s, err := Scheme()
	if err != nil {
		t.Fatal(err)
	}
	ours := testworld.ResourceSlice("node-a", testworld.WholeGPU(0))
	nic := testworld.ResourceSlice("node-b")
	nic.Spec.Driver = "nic.example.com"
	c := &cachedSlices{}
	c.use(fake.NewClientBuilder().WithScheme(s).WithObjects(ours).Build())
	c.useShapes(fake.NewClientBuilder().WithScheme(s).WithObjects(nic).Build())
	want := `
# HELP gpuaas_controller_cached_resourceslices ResourceSlices in the controller's caches, by driver (the controller's own driver's, and on the leader those of the drivers a GpuShape reaches).
# TYPE gpuaas_controller_cached_resourceslices gauge
gpuaas_controller_cached_resourceslices{driver="` + testworld.Driver + `"} 1
gpuaas_controller_cached_resourceslices{driver="nic.example.com"} 1
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
}
