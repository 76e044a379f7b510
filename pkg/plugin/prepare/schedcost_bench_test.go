package prepare

import (
	"fmt"
	"maps"
	"testing"

	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/inventory"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/klog/v2"

	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/prepare/preparetest"
)

// BenchmarkSchedulerFilter is the kube-scheduler's work per node for one
// pod's one-device claim on the slices this package publishes: the DRA
// plugin's Filter runs the structured allocator (the same code, from
// k8s.io/dynamic-resource-allocation) once per candidate node and pod, and
// that allocator converts the node's slices and checks every candidate
// device's counters against every counter set of its pool. It is what the
// scale benchmark (test/e2e/scale) measures through the real scheduler,
// without the cluster, so layouts can be compared quickly; "half-full"
// has GPUs 0-3 of the node already allocated (as whole GPUs), and
// "four-profiles" offers four MIG profiles (NodeConfig migProfiles).
// "eight-attributes" is a what-if, not a layout the plugin publishes: MIG
// devices stripped of the attributes they repeat from their GPU, to
// measure what those cost the scheduler.
//
//	go test -run '^$' -bench SchedulerFilter -benchmem ./pkg/plugin/
func BenchmarkSchedulerFilter(b *testing.B) {
	for _, c := range []struct {
		name, class string
		config      *configapi.NodeConfig
		halfFull    bool
		stripMIG    bool
	}{
		{"whole-gpu", "whole", &configapi.NodeConfig{}, false, false},
		{"dynamic-mig-1g", "mig-1g", preparetest.DynamicAll(), false, false},
		{"dynamic-mig-1g-half-full", "mig-1g", preparetest.DynamicAll(), true, false},
		{"dynamic-mig-1g-four-profiles", "mig-1g", migProfilesOnly(fourProfiles...), false, false},
		{"dynamic-mig-1g-four-profiles-half-full", "mig-1g", migProfilesOnly(fourProfiles...), true, false},
		{"dynamic-mig-1g-eight-attributes", "mig-1g", preparetest.DynamicAll(), false, true},
	} {
		b.Run(c.name, func(b *testing.B) {
			e := newTestEnv(b, "dgxh100")
			slices := preparetest.APISlices(inventory.Resources(testNode, inventory.Discover(klog.Background(), e.Lib, c.config)))
			if c.stripMIG {
				stripRepeatedAttributes(slices)
			}
			state := structured.AllocatedState{AllocatedDevices: sets.New[structured.DeviceID]()}
			if c.halfFull {
				for i := range 4 {
					state.AllocatedDevices.Insert(structured.MakeDeviceID(configapi.DriverName, testNode, fmt.Sprintf("gpu-%d", i)))
				}
			}
			forScheduler := preparetest.ForScheduler(b, slices)
			node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: testNode}}
			claims := []*resourceapi.ResourceClaim{preparetest.OneDeviceClaim(c.class)}
			cache := cel.NewCache(10, cel.Features{EnableConsumableCapacity: true})
			for b.Loop() {
				alloc, err := structured.NewAllocator(b.Context(), preparetest.SchedulerFeatures, state, benchClasses, forScheduler, cache)
				if err != nil {
					b.Fatal(err)
				}
				res, err := alloc.Allocate(b.Context(), node, claims)
				if err != nil || len(res) != 1 {
					b.Fatalf("allocating: %v (%d results)", err, len(res))
				}
			}
		})
	}
}

// migOwnAttributes are what a MIG device keeps in the eight-attributes
// what-if: its own, and the two the demo catalog's selectors name.
var migOwnAttributes = sets.New[resourceapi.QualifiedName]("type", "profile", "parentUUID",
	"computeSlices", "totalComputeSlices", "memorySlices", "productName", "architecture")

func stripRepeatedAttributes(slices []*resourceapi.ResourceSlice) {
	for _, s := range slices {
		for i := range s.Spec.Devices {
			d := &s.Spec.Devices[i]
			if t := d.Attributes["type"].StringValue; t == nil || *t != "mig" {
				continue
			}
			maps.DeleteFunc(d.Attributes, func(name resourceapi.QualifiedName, _ resourceapi.DeviceAttribute) bool {
				return !migOwnAttributes.Has(name)
			})
		}
	}
}

// fourProfiles are what a catalog selling small, medium, large MIG slices
// and whole GPUs offers: 14 devices per H100 instead of 29.
var fourProfiles = []string{"1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb"}

// benchClasses are the demo catalog's classes (demo/specs/00-catalog).
var benchClasses = preparetest.ClassLister{
	"whole": preparetest.CELClass("whole", `device.driver == "gpu.gpuaas.io" && device.attributes["gpu.gpuaas.io"].type == "gpu"`),
	"mig-1g": preparetest.CELClass("mig-1g", `device.driver == "gpu.gpuaas.io" && device.attributes["gpu.gpuaas.io"].type == "mig" && `+
		`device.attributes["gpu.gpuaas.io"].profile == "1g.10gb"`),
}
