package mig_test

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/NVIDIA/go-nvlib/pkg/nvlib/device"
	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"github.com/gpuaas/gpu-dra-driver/pkg/mig"
	"github.com/gpuaas/gpu-dra-driver/pkg/mig/migtest"
)

// hopper returns GPU 0 of a completed H100 machine with MIG mode on.
func hopper(t *testing.T) (*server.Server, *server.Device, []mig.Profile) {
	t.Helper()
	s := machine(t, h100_80)
	d := gpu(s, 0)
	if err := mig.EnableMigMode(d); err != nil {
		t.Fatal(err)
	}
	return s, d, profiles(t, d)
}

func create(t *testing.T, d nvml.Device, p mig.Profile, start int) mig.Instance {
	t.Helper()
	i := len(p.Placements) - 1
	for i > 0 && p.Placements[i].Start != start {
		i--
	}
	inst, err := mig.Create(d, p, p.Placements[i])
	if err != nil {
		t.Fatal(err)
	}
	return inst
}

func list(t *testing.T, d nvml.Device) []mig.Instance {
	t.Helper()
	insts, err := mig.List(d)
	if err != nil {
		t.Fatal(err)
	}
	return insts
}

func TestCreateListDestroy(t *testing.T) {
	s, d, ps := hopper(t)
	p := profileNamed(t, ps, "3g.40gb")
	inst := create(t, d, p, 4)
	want := mig.Instance{GIID: inst.GIID, CIID: inst.CIID, GIProfileID: p.GIProfileID, CIProfileID: p.CIProfileID,
		Profile: "3g.40gb", Placement: p.Placements[1], UUID: migtest.MigUUID(d.UUID, inst.GIID, inst.CIID)}
	if inst != want {
		t.Fatalf("Create = %+v, want %+v", inst, want)
	}
	if got := list(t, d); len(got) != 1 || got[0] != inst {
		t.Fatalf("List = %+v, want [%+v]", got, inst)
	}
	// The MIG device is what CUDA and CDI will look up by UUID, and
	// go-nvlib names it with the same profile.
	m, ret := s.DeviceGetHandleByUUID(inst.UUID)
	if ret != nvml.SUCCESS {
		t.Fatalf("no MIG device handle for %s: %v", inst.UUID, ret)
	}
	md, err := device.New(s).NewMigDevice(m)
	if err != nil {
		t.Fatal(err)
	}
	if mp, err := md.GetProfile(); err != nil || mp.String() != "3g.40gb" {
		t.Fatalf("go-nvlib sees profile %v, %v", mp, err)
	}
	if err := mig.Destroy(d, inst); err != nil {
		t.Fatal(err)
	}
	if got := list(t, d); len(got) != 0 {
		t.Fatalf("after Destroy, List = %+v", got)
	}
	if err := mig.Destroy(d, inst); err != nil {
		t.Fatalf("second Destroy: %v", err)
	}
}

func TestCreateRefusedLeavesNothing(t *testing.T) {
	_, d, ps := hopper(t)
	big := create(t, d, profileNamed(t, ps, "4g.40gb"), 0)
	small := profileNamed(t, ps, "1g.10gb")
	if _, err := mig.Create(d, small, small.Placements[2]); err == nil {
		t.Fatal("created a 1g.10gb inside the 4g.40gb")
	}
	if got := list(t, d); len(got) != 1 || got[0] != big {
		t.Fatalf("List = %+v, want only %+v", got, big)
	}
}

func TestCreateNeedsMigMode(t *testing.T) {
	d := gpu(machine(t, h100_80), 0)
	p := profileNamed(t, profiles(t, d), "1g.10gb")
	if _, err := mig.Create(d, p, p.Placements[0]); err == nil {
		t.Fatal("created a MIG device with MIG mode off")
	}
}

// A compute-instance failure rolls back the GPU instance.
func TestCreateRollsBackGPUInstance(t *testing.T) {
	_, d, ps := hopper(t)
	failCI := func(gi nvml.GpuInstance) {
		gi.(*server.GpuInstance).CreateComputeInstanceFunc = func(*nvml.ComputeInstanceProfileInfo) (nvml.ComputeInstance, nvml.Return) {
			return nil, nvml.ERROR_INSUFFICIENT_RESOURCES
		}
	}
	var created nvml.GpuInstance
	createGI := d.CreateGpuInstanceWithPlacementFunc
	d.CreateGpuInstanceWithPlacementFunc = func(info *nvml.GpuInstanceProfileInfo, pl *nvml.GpuInstancePlacement) (nvml.GpuInstance, nvml.Return) {
		gi, ret := createGI(info, pl)
		if ret == nvml.SUCCESS {
			failCI(gi)
			created = gi
		}
		return gi, ret
	}
	p := profileNamed(t, ps, "2g.20gb")
	_, err := mig.Create(d, p, p.Placements[0])
	if err == nil || !strings.Contains(err.Error(), "creating 2g.20gb compute instance") {
		t.Fatalf("Create = %v, want the compute instance failure", err)
	}
	if created == nil {
		t.Fatal("no GPU instance was created before the failure")
	}
	if n := len(d.GpuInstances); n != 0 {
		t.Fatalf("%d GPU instances left after rollback", n)
	}
}

// A failure after both instances exist (finding the MIG device) rolls back
// both, compute instance first.
func TestCreateRollsBackBoth(t *testing.T) {
	_, d, ps := hopper(t)
	d.GetMigDeviceHandleByIndexFunc = func(int) (nvml.Device, nvml.Return) { return nil, nvml.ERROR_UNKNOWN }
	p := profileNamed(t, ps, "1g.10gb")
	if _, err := mig.Create(d, p, p.Placements[6]); err == nil || !errors.Is(err, nvml.ERROR_UNKNOWN) {
		t.Fatalf("Create = %v, want the MIG device lookup failure", err)
	}
	if n := len(d.GpuInstances); n != 0 {
		t.Fatalf("%d GPU instances left after rollback", n)
	}
}

// When the rollback fails too, both failures are reported.
func TestCreateReportsFailedRollback(t *testing.T) {
	_, d, ps := hopper(t)
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
	p := profileNamed(t, ps, "1g.10gb")
	_, err := mig.Create(d, p, p.Placements[0])
	if !errors.Is(err, nvml.ERROR_NOT_SUPPORTED) || !errors.Is(err, nvml.ERROR_GPU_IS_LOST) {
		t.Fatalf("Create = %v, want both the failure and the failed rollback", err)
	}
}

// Destroy after a half-done Destroy (compute instance gone) removes the
// GPU instance.
func TestDestroyFinishesHalfDone(t *testing.T) {
	_, d, ps := hopper(t)
	inst := create(t, d, profileNamed(t, ps, "1g.20gb"), 6)
	gi, _ := d.GetGpuInstanceById(inst.GIID)
	ci, _ := gi.GetComputeInstanceById(inst.CIID)
	if ret := ci.Destroy(); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if err := mig.Destroy(d, inst); err != nil {
		t.Fatal(err)
	}
	if n := len(d.GpuInstances); n != 0 {
		t.Fatalf("%d GPU instances left", n)
	}
}

// IDs that now name a different instance are left alone.
func TestDestroyLeavesReplacement(t *testing.T) {
	_, d, ps := hopper(t)
	other := create(t, d, profileNamed(t, ps, "2g.20gb"), 4)
	stale := other
	stale.Profile, stale.GIProfileID = "1g.10gb", profileNamed(t, ps, "1g.10gb").GIProfileID
	if err := mig.Destroy(d, stale); !errors.Is(err, mig.ErrReplaced) {
		t.Fatalf("Destroy with another profile = %v, want ErrReplaced", err)
	}
	stale = other
	stale.UUID = "MIG-00000000-0000-0000-0000-000000000000"
	if err := mig.Destroy(d, stale); !errors.Is(err, mig.ErrReplaced) {
		t.Fatalf("Destroy with another UUID = %v, want ErrReplaced", err)
	}
	if got := list(t, d); len(got) != 1 || got[0] != other {
		t.Fatalf("the replacement was touched: List = %+v", got)
	}
}

func TestDestroyWithMigOff(t *testing.T) {
	d := gpu(machine(t, h100_80), 0)
	d.GetGpuInstanceByIdFunc = func(int) (nvml.GpuInstance, nvml.Return) { return nil, nvml.ERROR_NOT_SUPPORTED }
	if err := mig.Destroy(d, mig.Instance{GIID: 3, CIID: 0, Profile: "1g.10gb"}); err != nil {
		t.Fatalf("Destroy on a GPU with MIG off: %v", err)
	}
}

// Static mode: List reports what an admin made, compute variants included,
// and StaticDevice names them uniquely.
func TestListStaticLayout(t *testing.T) {
	_, d, ps := hopper(t)
	create(t, d, profileNamed(t, ps, "4g.40gb"), 0)
	create(t, d, profileNamed(t, ps, "1g.10gb+me"), 6)
	// A 2g.20gb split into two 1c compute instances, as nvidia-smi would.
	info, _ := d.GetGpuInstanceProfileInfo(nvml.GPU_INSTANCE_PROFILE_2_SLICE)
	gi, ret := d.CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: 4, Size: 2})
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	ciInfo, _ := gi.GetComputeInstanceProfileInfo(nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
	for range 2 {
		if _, ret := gi.CreateComputeInstance(&ciInfo); ret != nvml.SUCCESS {
			t.Fatal(ret)
		}
	}
	if _, ret := gi.CreateComputeInstance(&ciInfo); ret != nvml.ERROR_INSUFFICIENT_RESOURCES {
		t.Fatalf("a third 1c in a 2g: %v", ret)
	}
	insts := list(t, d)
	var got []string
	totals := mig.Totals(ps)
	parent := parentOf(t, d)
	for _, inst := range insts {
		p := profileNamed(t, ps, inst.Profile)
		dev := mig.StaticDevice(parent, p, inst, totals, mig.CounterSetName(0))
		if *dev.Attributes[mig.AttrUUID].StringValue != inst.UUID || inst.UUID == "" {
			t.Errorf("%s: uuid attribute %v, instance %s", dev.Name, dev.Attributes[mig.AttrUUID], inst.UUID)
		}
		got = append(got, fmt.Sprintf("%s %s", inst.Profile, dev.Name))
	}
	want := []string{
		"4g.40gb gpu-0-mig-4g40gb-0",
		"1g.10gb+me gpu-0-mig-1g10gbme-6",
		"1c.2g.20gb gpu-0-mig-1c2g20gb-4-ci0",
		"1c.2g.20gb gpu-0-mig-1c2g20gb-4-ci1",
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("static devices:\n got %v\nwant %v", got, want)
	}
}

func TestListWithMigOff(t *testing.T) {
	if got := list(t, gpu(machine(t, h100_80), 0)); got != nil {
		t.Fatalf("List with MIG off = %+v", got)
	}
}

// Per-GPU locking lets prepares on different GPUs run at once.
func TestCreateDestroyConcurrentGPUs(t *testing.T) {
	s := machine(t, h100_80)
	var wg sync.WaitGroup
	errs := make(chan error, len(s.Devices))
	for i := range s.Devices {
		d := gpu(s, i)
		if err := mig.EnableMigMode(d); err != nil {
			t.Fatal(err)
		}
		ps := profiles(t, d)
		todo := []mig.Profile{profileNamed(t, ps, "1g.10gb"), profileNamed(t, ps, "3g.40gb"), profileNamed(t, ps, "7g.80gb")}
		wg.Go(func() {
			for _, p := range todo {
				inst, err := mig.Create(d, p, p.Placements[0])
				if err == nil {
					err = mig.Destroy(d, inst)
				}
				if err != nil {
					errs <- fmt.Errorf("GPU %d %s: %w", d.Index, p.Name, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
