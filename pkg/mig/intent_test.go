package mig_test

import (
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"github.com/gpuaas/gpu-dra-driver/pkg/mig"
	resourceapi "k8s.io/api/resource/v1"
)

// bareGI creates only the GPU instance of p at placement pl, as
// a Create cut short before its compute instance leaves it.
func bareGI(t *testing.T, d *server.Device, p mig.Profile, pl mig.Placement) {
	t.Helper()
	info, ret := d.GetGpuInstanceProfileInfo(p.GIProfileID)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	place := nvml.GpuInstancePlacement{Start: uint32(pl.Start), Size: uint32(pl.Size)}
	if _, ret := d.CreateGpuInstanceWithPlacement(&info, &place); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
}

func listGIs(t *testing.T, d nvml.Device) []mig.GPUInstance {
	t.Helper()
	gis, err := mig.ListGPUInstances(d)
	if err != nil {
		t.Fatal(err)
	}
	return gis
}

// ListGPUInstances sees bare GPU instances, which List (MIG devices) does
// not: a Create cut short leaves one holding its placement.
func TestListGPUInstancesIncludesBare(t *testing.T) {
	_, d, ps := hopper(t)
	full := create(t, d, profileNamed(t, ps, "3g.40gb"), 4)
	small := profileNamed(t, ps, "1g.10gb")
	bareGI(t, d, small, small.Placements[0])
	gis := listGIs(t, d)
	if len(gis) != 2 {
		t.Fatalf("ListGPUInstances = %+v, want the full and the bare one", gis)
	}
	if gis[0].GIID != full.GIID || len(gis[0].Devices) != 1 || gis[0].Devices[0] != full || gis[0].Placement != full.Placement {
		t.Errorf("full GPU instance = %+v, want it with %+v", gis[0], full)
	}
	if gis[1].GIProfileID != small.GIProfileID || gis[1].Placement != small.Placements[0] || len(gis[1].Devices) != 0 {
		t.Errorf("bare GPU instance = %+v, want %s at %+v without MIG devices", gis[1], small.Name, small.Placements[0])
	}
}

// DestroyAt removes what an interrupted Create of an intent left, bare or
// whole, and nothing at any other placement or of another profile.
func TestDestroyAtRemovesOnlyTheIntendedPlacement(t *testing.T) {
	_, d, ps := hopper(t)
	small, two := profileNamed(t, ps, "1g.10gb"), profileNamed(t, ps, "2g.20gb")
	create(t, d, small, small.Placements[0].Start)
	bareGI(t, d, small, small.Placements[1])
	kept := create(t, d, two, 4)
	for _, pl := range small.Placements[:2] {
		if err := mig.DestroyAt(d, mig.IntentOf(small, pl)); err != nil {
			t.Fatalf("DestroyAt %+v: %v", pl, err)
		}
	}
	// Nothing there, or something of another profile: left alone.
	if err := mig.DestroyAt(d, mig.IntentOf(small, small.Placements[6])); err != nil {
		t.Fatalf("DestroyAt at an empty placement: %v", err)
	}
	if err := mig.DestroyAt(d, mig.IntentOf(small, small.Placements[4])); err != nil {
		t.Fatalf("DestroyAt inside another profile's instance: %v", err)
	}
	if gis := listGIs(t, d); len(gis) != 1 || gis[0].GIID != kept.GIID {
		t.Fatalf("GPU instances left = %+v, want only %+v", gis, kept)
	}
}

func TestDestroyAtWithMigOff(t *testing.T) {
	d := gpu(machine(t, h100_80), 0)
	p := profileNamed(t, profiles(t, d), "1g.10gb")
	if err := mig.DestroyAt(d, mig.IntentOf(p, p.Placements[0])); err != nil {
		t.Fatalf("DestroyAt on a GPU with MIG off: %v", err)
	}
}

// A failed Create is marked ErrLeftBehind only when its rollback failed:
// the caller then knows whether what is at the placement can be its own.
func TestCreateMarksOnlyFailedRollbackAsLeftBehind(t *testing.T) {
	_, d, ps := hopper(t)
	big := create(t, d, profileNamed(t, ps, "4g.40gb"), 0)
	small := profileNamed(t, ps, "1g.10gb")
	if _, err := mig.Create(d, small, small.Placements[0]); err == nil || errors.Is(err, mig.ErrLeftBehind) {
		t.Fatalf("Create on an occupied placement = %v, want an error that left nothing", err)
	}
	if err := mig.Destroy(d, big); err != nil {
		t.Fatal(err)
	}
	createGI := d.CreateGpuInstanceWithPlacementFunc
	d.CreateGpuInstanceWithPlacementFunc = func(info *nvml.GpuInstanceProfileInfo, pl *nvml.GpuInstancePlacement) (nvml.GpuInstance, nvml.Return) {
		gi, ret := createGI(info, pl)
		mgi := gi.(*server.GpuInstance)
		mgi.GetComputeInstanceProfileInfoFunc = func(int, int) (nvml.ComputeInstanceProfileInfo, nvml.Return) {
			return nvml.ComputeInstanceProfileInfo{}, nvml.ERROR_NOT_SUPPORTED
		}
		mgi.DestroyFunc = func() nvml.Return { return nvml.ERROR_GPU_IS_LOST }
		return gi, ret
	}
	if _, err := mig.Create(d, small, small.Placements[0]); !errors.Is(err, mig.ErrLeftBehind) {
		t.Fatalf("Create whose rollback failed = %v, want ErrLeftBehind", err)
	}
}

// What Remaining leaves of a GPU holding GPU instances that no claim owns
// is creatable next to them: random first-fit packings of the devices that
// still fit are created on the mock, which refuses what NVML refuses. The
// devices at the unowned placements never fit.
func TestRemainingPackingsAreCreatable(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, product := range products {
		d := gpu(machine(t, product), 0)
		migOn(t, d)
		l := layout(t, d)
		for range 50 {
			unowned := createUnowned(t, d, l, rng)
			remaining := l.Remaining(listGIs(t, d))
			for _, p := range unowned {
				if mig.Fits(remaining, p.Device.ConsumesCounters) {
					t.Fatalf("%s: %s fits although an unowned instance is there", product, p.Device.Name)
				}
			}
			if mig.Fits(remaining, l.WholeGPU) {
				t.Fatalf("%s: the whole GPU fits beside unowned instances", product)
			}
			createAll(t, d, firstFit(l, remaining, rng))
			destroyAllGIs(t, d)
		}
	}
}

// createUnowned creates a random first-fit packing of one to three
// partitions, as an admin might.
func createUnowned(t *testing.T, d nvml.Device, l mig.Layout, rng *rand.Rand) []mig.Partition {
	t.Helper()
	var picked []mig.Partition
	var devs []resourceapi.Device
	for _, i := range rng.Perm(len(l.Partitions))[:1+rng.IntN(3)] {
		p := l.Partitions[i]
		if fits(l.CounterSet, append(devs, p.Device)...) {
			picked, devs = append(picked, p), append(devs, p.Device)
		}
	}
	for _, p := range picked {
		if _, err := mig.Create(d, p.Profile, p.Placement); err != nil {
			t.Fatal(err)
		}
	}
	return picked
}

func firstFit(l mig.Layout, set resourceapi.CounterSet, rng *rand.Rand) []mig.Partition {
	var picked []mig.Partition
	var devs []resourceapi.Device
	for _, i := range rng.Perm(len(l.Partitions)) {
		p := l.Partitions[i]
		if fits(set, append(devs, p.Device)...) {
			picked, devs = append(picked, p), append(devs, p.Device)
		}
	}
	return picked
}

func destroyAllGIs(t *testing.T, d nvml.Device) {
	t.Helper()
	insts := list(t, d)
	for _, inst := range insts {
		if err := mig.Destroy(d, inst); err != nil {
			t.Fatal(err)
		}
	}
}

// A GPU instance at a placement the layout does not offer takes the whole
// GPU: nothing smaller is known to be safe.
func TestRemainingOfUnknownPlacementIsNothing(t *testing.T) {
	l := layout(t, gpu(machine(t, h100_80), 0))
	remaining := l.Remaining([]mig.GPUInstance{{GIID: 9, GIProfileID: 99, Placement: mig.Placement{Start: 3, Size: 1}}})
	for _, p := range l.Partitions {
		if mig.Fits(remaining, p.Device.ConsumesCounters) {
			t.Fatalf("%s fits beside an instance of unknown shape", p.Device.Name)
		}
	}
	if len(remaining.Counters) != len(l.CounterSet.Counters) {
		t.Errorf("remaining set has %d counters, want all %d (at zero)", len(remaining.Counters), len(l.CounterSet.Counters))
	}
}

// A GPU instance the plugin did not make takes what its own partition
// takes even when the layout does not offer that profile: offering fewer
// profiles must not make an admin's instance block the whole GPU.
func TestRemainingKnowsProfilesNotOffered(t *testing.T) {
	d := gpu(machine(t, h100_80), 0)
	all := layout(t, d)
	some := layout(t, d)
	if err := some.Offer([]string{"1g.10gb"}); err != nil {
		t.Fatal(err)
	}
	var twoG mig.Partition
	for _, p := range all.Partitions {
		if p.Profile.Name == "2g.20gb" {
			twoG = p
		}
	}
	gi := []mig.GPUInstance{{GIID: 1, GIProfileID: twoG.Profile.GIProfileID, Placement: twoG.Placement}}
	want, got := all.Remaining(gi), some.Remaining(gi)
	for name, c := range want.Counters {
		if g := got.Counters[name]; g.Value.Cmp(c.Value) != 0 {
			t.Errorf("counter %s: %s left with 1g.10gb offered, %s with every profile", name, g.Value.String(), c.Value.String())
		}
	}
	if err := some.Offer([]string{"9g.99gb"}); err == nil {
		t.Error("offering a profile the GPU lacks: no error")
	}
}
