package migtest_test

import (
	"testing"

	"github.com/NVIDIA/go-nvlib/pkg/nvlib/device"
	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"github.com/gpuaas/gpu-dra-driver/pkg/mig/migtest"
)

func completed(t *testing.T) (*server.Server, *server.Device) {
	t.Helper()
	s := dgxh100.New()
	migtest.CompleteMock(s)
	d := s.Devices[1].(*server.Device)
	if _, ret := d.SetMigMode(nvml.DEVICE_MIG_ENABLE); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	return s, d
}

func newGI(t *testing.T, d *server.Device, profile int, start uint32) (nvml.GpuInstance, nvml.Return) {
	t.Helper()
	info, ret := d.GetGpuInstanceProfileInfo(profile)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	pls, _ := d.GetGpuInstancePossiblePlacements(&info)
	for _, pl := range pls {
		if pl.Start == start {
			return d.CreateGpuInstanceWithPlacement(&info, &pl)
		}
	}
	t.Fatalf("profile %d has no placement at %d", profile, start)
	return nil, nvml.ERROR_UNKNOWN
}

func newCI(t *testing.T, gi nvml.GpuInstance, profile int) nvml.ComputeInstance {
	t.Helper()
	info, ret := gi.GetComputeInstanceProfileInfo(profile, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	ci, ret := gi.CreateComputeInstance(&info)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	return ci
}

// go-nvlib, which CDI generation and nvdev use, finds MIG devices on a
// completed mock, and NVML finds them by UUID.
func TestMigDevicesVisibleToGoNvlib(t *testing.T) {
	s, d := completed(t)
	gi, ret := newGI(t, d, nvml.GPU_INSTANCE_PROFILE_3_SLICE, 4)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	newCI(t, gi, nvml.COMPUTE_INSTANCE_PROFILE_3_SLICE)
	var uuids []string
	err := device.New(s).VisitMigDevices(func(i int, _ device.Device, _ int, m device.MigDevice) error {
		p, err := m.GetProfile()
		if err != nil {
			return err
		}
		if i != 1 || p.String() != "3g.40gb" {
			t.Errorf("MIG device on GPU %d with profile %s", i, p)
		}
		uuid, _ := m.GetUUID()
		uuids = append(uuids, uuid)
		return nil
	})
	if err != nil || len(uuids) != 1 {
		t.Fatalf("visited %v: %v", uuids, err)
	}
	m, ret := s.DeviceGetHandleByUUID(uuids[0])
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if parent, _ := m.GetDeviceHandleFromMigDeviceHandle(); parent != d {
		t.Error("MIG device's parent is not its GPU")
	}
	if _, ret := s.DeviceGetHandleByUUID("MIG-none"); ret != nvml.ERROR_NOT_FOUND {
		t.Errorf("unknown UUID: %v", ret)
	}
}

// The completed mock refuses what real NVML refuses.
func TestRefusals(t *testing.T) {
	_, d := completed(t)
	gi, ret := newGI(t, d, nvml.GPU_INSTANCE_PROFILE_4_SLICE, 0)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if _, ret := newGI(t, d, nvml.GPU_INSTANCE_PROFILE_2_SLICE, 2); ret != nvml.ERROR_INSUFFICIENT_RESOURCES {
		t.Errorf("overlapping GPU instance: %v", ret)
	}
	ci := newCI(t, gi, nvml.COMPUTE_INSTANCE_PROFILE_4_SLICE)
	if ret := gi.Destroy(); ret != nvml.ERROR_IN_USE {
		t.Errorf("destroying a GPU instance with a compute instance: %v", ret)
	}
	if _, ret := d.SetMigMode(nvml.DEVICE_MIG_DISABLE); ret != nvml.ERROR_IN_USE {
		t.Errorf("MIG mode off under a GPU instance: %v", ret)
	}
	if ret := ci.Destroy(); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if ret := ci.Destroy(); ret != nvml.ERROR_NOT_FOUND {
		t.Errorf("second compute instance destroy: %v", ret)
	}
	if ret := gi.Destroy(); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if ret := gi.Destroy(); ret != nvml.ERROR_NOT_FOUND {
		t.Errorf("second GPU instance destroy: %v", ret)
	}
	if _, ret := d.SetMigMode(nvml.DEVICE_MIG_DISABLE); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if _, ret := newGI(t, d, nvml.GPU_INSTANCE_PROFILE_1_SLICE, 0); ret != nvml.ERROR_NOT_SUPPORTED {
		t.Errorf("GPU instance with MIG mode off: %v", ret)
	}
}
