package packing_test

import (
	"flag"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/inventory"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/mig"
	"github.com/gpuaas/gpu-dra-driver/pkg/mig/packing"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
	_ "github.com/gpuaas/gpu-dra-driver/pkg/nvdev/nvmock" // the mock:<machine> backends
)

// BenchmarkMIGPacking plays seeded streams of MIG claims (arrivals and
// departures, per mix) against one 8-GPU node in dynamic MIG, allocated by
// the upstream structured allocator (the kube-scheduler's code) over
// exactly the ResourceSlices the plugin publishes, and the same streams
// with model packers. It reports, summed over the streams of a mix: claims
// refused (refused), claims refused while some GPU had the compute slices,
// memory slices and memory free (refused-room), and the mean compute
// slices of the largest profile the node could still take after each
// event (largest). Prefixes: "ours-" is the allocator on our slices;
// "gpumajor-" the first fit of the order published before issue 29 (each
// GPU's devices together, highest placement first), for comparison in one
// run; "bestfit-" the best-fit packer, which sees the node's state (the
// bound for an online packer that never moves a claim); "repack-" the
// packer that may move every claim (the bound for any packer; it has no
// refusals with room by construction, so none is reported). The streams
// are fixed by their seeds, so the figures are too: one iteration is
// enough.
//
//	go test -run '^$' -bench 'MIGPacking$' -benchtime 1x ./pkg/mig/packing/
//
// (add -args -packing.seeds=N -packing.arrivals=M for other streams).
func BenchmarkMIGPacking(b *testing.B) {
	for _, machine := range []string{"dgxh100", "dgxa100"} {
		node := publish(b, machine)
		for mi, mix := range packing.Mixes {
			b.Run(machine+"/"+mix.Name, func(b *testing.B) {
				var ours, gpuMajor, bestFit, repack packing.Result
				for b.Loop() {
					ours, gpuMajor, bestFit, repack = packing.Result{}, packing.Result{}, packing.Result{}, packing.Result{}
					for seed := range uint64(*benchSeeds) {
						events := packing.Stream(&node.shape, mix, node.gpus, *benchArrivals, benchLoad, 100*uint64(mi)+seed+1)
						ours.Add(node.allocate(b, events))
						gpuMajor.Add(run(b, node, events, gpuMajorOrder(node)))
						bestFit.Add(run(b, node, events, packing.BestFit{}))
						repack.Add(packing.RunRepack(&node.shape, node.gpus, events))
					}
				}
				report(b, "ours-", ours, true)
				report(b, "gpumajor-", gpuMajor, true)
				report(b, "bestfit-", bestFit, true)
				report(b, "repack-", repack, false)
			})
		}
	}
}

var (
	// benchSeeds streams per mix: enough that the order's effect stands
	// out of one stream's luck, few enough for the shared CI machine.
	benchSeeds = flag.Int("packing.seeds", 4, "streams per mix in BenchmarkMIGPacking")
	// benchArrivals is long enough for the node to fill and churn for
	// hundreds of refusals.
	benchArrivals = flag.Int("packing.arrivals", 1000, "claims per stream in BenchmarkMIGPacking")
)

// benchLoad offers 10% more compute slices than the node has.
const benchLoad = 1.1

func run(tb testing.TB, n *publishedNode, events []packing.Event, p packing.Packer) packing.Result {
	tb.Helper()
	r, err := packing.RunPacker(&n.shape, n.gpus, events, p)
	if err != nil {
		tb.Fatal(err)
	}
	return r
}

func report(b *testing.B, prefix string, r packing.Result, room bool) {
	b.ReportMetric(float64(r.Refused), prefix+"refused")
	if room {
		b.ReportMetric(float64(r.RefusedWithRoom), prefix+"refused-room")
	}
	b.ReportMetric(r.LargestMean, prefix+"largest")
}

// gpuMajorOrder is the order the plugin published before issue 29: GPU by
// GPU, within a GPU each profile's placements highest first.
func gpuMajorOrder(n *publishedNode) packing.FirstFit {
	var o packing.FirstFit
	for g := range n.gpus {
		for prof, p := range n.shape.Profiles {
			for _, pl := range slices.Backward(p.Placements) {
				o = append(o, packing.Place{GPU: g, Profile: prof, Placement: pl})
			}
		}
	}
	return o
}

// streamProfiles are the stream's profiles per machine, in the order the
// mixes weigh them: 1g, 2g, 3g, 4g, 7g.
var streamProfiles = map[string][]string{
	"dgxh100": {"1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"},
	"dgxa100": {"1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"},
}

const benchNode = "node-a"

// publishedNode is a mock node in dynamic MIG as the plugin publishes it.
type publishedNode struct {
	shape  packing.Shape
	gpus   int
	slices []*resourceapi.ResourceSlice
	// places are the MIG devices of the stream's profiles, by name.
	places map[string]packing.Place
	// order is the first fit the published slices imply: their devices of
	// the stream's profiles in the allocator's order (slices by name,
	// devices as listed).
	order packing.FirstFit
}

// publish builds the plugin's inventory and slices for every GPU of a
// mock machine in dynamic MIG. MIG mode is enabled first, as the admin of
// an A100 (which needs a reset for it) would have done.
func publish(tb testing.TB, machine string) *publishedNode {
	tb.Helper()
	opts := nvdev.Options{Backend: "mock:" + machine, MockSeed: benchNode, MockStateDir: filepath.Join(tb.TempDir(), "mock")}
	lib, err := nvdev.Open(opts)
	if err != nil {
		tb.Fatal(err)
	}
	for _, g := range lib.GPUs() {
		dev, err := lib.DeviceByUUID(g.UUID)
		if err != nil {
			tb.Fatal(err)
		}
		if _, ret := dev.SetMigMode(nvml.DEVICE_MIG_ENABLE); ret != nvml.SUCCESS {
			tb.Fatalf("enabling MIG mode: %v", ret)
		}
	}
	if lib, err = nvdev.Open(opts); err != nil {
		tb.Fatal(err)
	}
	dev, err := lib.DeviceByUUID(lib.GPUs()[0].UUID)
	if err != nil {
		tb.Fatal(err)
	}
	all, err := mig.Profiles(dev)
	if err != nil {
		tb.Fatal(err)
	}
	shape, err := packing.NewShape(all, streamProfiles[machine]...)
	if err != nil {
		tb.Fatal(err)
	}
	cfg := &configapi.NodeConfig{Default: configapi.GpuMode{MIG: configapi.MigDynamic, MigModeEnabledByAdmin: true}}
	inv := inventory.Discover(klog.Background(), lib, cfg)
	n := &publishedNode{shape: shape, gpus: len(lib.GPUs()), places: map[string]packing.Place{},
		slices: apiSlices(inventory.Resources(benchNode, inv).Pools[benchNode].Slices)}
	for _, d := range inv.Devices {
		if d.Partition() == nil {
			continue
		}
		if i := slices.IndexFunc(shape.Profiles, func(p mig.Profile) bool { return p.Name == d.Partition().Profile.Name }); i >= 0 {
			n.places[d.API.Name] = packing.Place{GPU: d.GPU.Index, Profile: i, Placement: d.Partition().Placement}
		}
	}
	if len(n.places) == 0 {
		tb.Fatalf("%s: the plugin published no dynamic MIG devices of %v", machine, streamProfiles[machine])
	}
	sorted := slices.Clone(n.slices)
	slices.SortFunc(sorted, func(a, b *resourceapi.ResourceSlice) int { return strings.Compare(a.Name, b.Name) })
	for _, s := range sorted {
		for _, d := range s.Spec.Devices {
			if p, ok := n.places[d.Name]; ok {
				n.order = append(n.order, p)
			}
		}
	}
	return n
}

// apiSlices are the ResourceSlices the resourceslice controller stores
// for the pool: named as it names them (the index in fixed-width hex
// first), so the allocator, which sorts a pool's slices by name, sees them
// in the plugin's order.
func apiSlices(pool []resourceslice.Slice) []*resourceapi.ResourceSlice {
	var out []*resourceapi.ResourceSlice
	for i, s := range pool {
		out = append(out, &resourceapi.ResourceSlice{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%04x-%s-%s", i, configapi.DriverName, benchNode)},
			Spec: resourceapi.ResourceSliceSpec{
				Driver:         configapi.DriverName,
				Pool:           resourceapi.ResourcePool{Name: benchNode, Generation: 1, ResourceSliceCount: int64(len(pool))},
				NodeName:       ptr.To(benchNode),
				Devices:        s.Devices,
				SharedCounters: s.SharedCounters,
			},
		})
	}
	return out
}

// allocate plays the stream with the upstream allocator deciding every
// arrival, and checks that it picks exactly the device the model's first
// fit over the published order picks: where the two differ, the model's
// reading of NVIDIA's rules (and so "had room" and "largest") would be
// wrong for these slices.
func (n *publishedNode) allocate(tb testing.TB, events []packing.Event) packing.Result {
	tb.Helper()
	state := structured.AllocatedState{AllocatedDevices: sets.New[structured.DeviceID]()}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: benchNode}}
	cache := cel.NewCache(10, cel.Features{EnableConsumableCapacity: true})
	classes := profileClasses(n.shape)
	var failed error
	r, err := packing.Run(&n.shape, n.gpus, events, func(model *packing.Node, claim, prof int) (packing.Place, bool) {
		want, wantOK := n.order.Choose(model, prof)
		alloc, err := structured.NewAllocator(tb.Context(), schedulerFeatures, state, classes, n.slices, cache)
		if err != nil {
			tb.Fatal(err)
		}
		res, err := alloc.Allocate(tb.Context(), node, []*resourceapi.ResourceClaim{profileClaim(claim, n.shape.Profiles[prof].Name)})
		if err != nil {
			tb.Fatalf("allocating claim %d: %v", claim, err)
		}
		if len(res) == 0 {
			if wantOK && failed == nil {
				failed = fmt.Errorf("claim %d (%s): the allocator refused it, the model's first fit placed it at %+v", claim, n.shape.Profiles[prof].Name, want)
			}
			return packing.Place{}, false
		}
		name := res[0].Devices.Results[0].Device
		got, ok := n.places[name]
		if !ok {
			tb.Fatalf("claim %d (%s) got device %s, not one of the profile's", claim, n.shape.Profiles[prof].Name, name)
		}
		if (got != want || !wantOK) && failed == nil {
			failed = fmt.Errorf("claim %d (%s): the allocator chose %s (%+v), the model's first fit %+v (%v)", claim, n.shape.Profiles[prof].Name, name, got, want, wantOK)
		}
		state.AllocatedDevices.Insert(structured.MakeDeviceID(configapi.DriverName, benchNode, name))
		return got, true
	}, func(claim int, p packing.Place) {
		state.AllocatedDevices.Delete(structured.MakeDeviceID(configapi.DriverName, benchNode, deviceName(n, p)))
	})
	if err != nil {
		tb.Fatal(err)
	}
	if failed != nil {
		tb.Fatal(failed)
	}
	return r
}

func deviceName(n *publishedNode, p packing.Place) string {
	return mig.DeviceName(p.GPU, n.shape.Profiles[p.Profile], p.Placement)
}

// schedulerFeatures are the allocator features of a v1.37 scheduler with
// the gates the e2e cluster runs.
var schedulerFeatures = structured.Features{
	AdminAccess: true, ConsumableCapacity: true, DeviceTaints: true,
	PartitionableDevices: true, PrioritizedList: true,
}

// profileClasses are one DeviceClass per profile of the shape, as the
// catalog renders a GpuProfile of a MIG profile.
func profileClasses(s packing.Shape) classLister {
	l := classLister{}
	for _, p := range s.Profiles {
		l[p.Name] = &resourceapi.DeviceClass{
			ObjectMeta: metav1.ObjectMeta{Name: className(p.Name)},
			Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
				Expression: fmt.Sprintf(`device.driver == %q && device.attributes[%q].type == "mig" && device.attributes[%q].profile == %q`,
					configapi.DriverName, configapi.DriverName, configapi.DriverName, p.Name),
			}}}},
		}
	}
	return l
}

func className(profile string) string { return "mig-" + strings.ReplaceAll(profile, ".", "-") }

func profileClaim(claim int, profile string) *resourceapi.ResourceClaim {
	name := fmt.Sprintf("claim-%d", claim)
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID(name)},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: "mig", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: className(profile),
				AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1},
		}}}},
	}
}

// classLister serves the classes by profile name or class name.
type classLister map[string]*resourceapi.DeviceClass

func (l classLister) List() ([]*resourceapi.DeviceClass, error) {
	var out []*resourceapi.DeviceClass
	for _, c := range l {
		out = append(out, c)
	}
	return out, nil
}

func (l classLister) Get(name string) (*resourceapi.DeviceClass, error) {
	for _, c := range l {
		if c.Name == name {
			return c, nil
		}
	}
	return nil, fmt.Errorf("no DeviceClass %q", name)
}

// The allocator, on the plugin's slices, picks exactly what the model's
// first fit over the published order picks, on a short stream of every
// mix (allocate fails the test otherwise): the model's rules are the
// counters', so its "room" and "largest" speak for the allocator.
func TestAllocatorAgreesWithModel(t *testing.T) {
	for _, machine := range []string{"dgxh100", "dgxa100"} {
		node := publish(t, machine)
		for mi, mix := range packing.Mixes {
			events := packing.Stream(&node.shape, mix, node.gpus, 120, benchLoad, uint64(mi)+1)
			if r := node.allocate(t, events); r.Refused == 0 {
				t.Errorf("%s %s: nothing refused; the stream does not fill the node", machine, mix.Name)
			}
		}
	}
}
