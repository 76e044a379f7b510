package mig_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/gpuaas/gpu-dra-driver/pkg/mig"
)

func migMode(t *testing.T, d nvml.Device) int {
	t.Helper()
	mode, _, ret := d.GetMigMode()
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	return mode
}

func TestEnableMigModeHopper(t *testing.T) {
	d := gpu(machine(t, h100_80), 0)
	for range 2 { // the second call finds it on
		if err := mig.EnableMigMode(d); err != nil {
			t.Fatal(err)
		}
		if migMode(t, d) != nvml.DEVICE_MIG_ENABLE {
			t.Fatal("MIG mode is still off")
		}
	}
}

// Ampere needs a reset to switch: the driver refuses and changes nothing,
// unless the admin has already turned MIG on.
func TestEnableMigModeAmpere(t *testing.T) {
	d := gpu(machine(t, a100_40), 0)
	if err := mig.EnableMigMode(d); !errors.Is(err, mig.ErrNeedsAdmin) {
		t.Fatalf("EnableMigMode on Ampere = %v, want ErrNeedsAdmin", err)
	}
	if migMode(t, d) != nvml.DEVICE_MIG_DISABLE {
		t.Fatal("MIG mode changed")
	}
	migOn(t, d)
	if err := mig.EnableMigMode(d); err != nil {
		t.Fatalf("EnableMigMode with MIG already on: %v", err)
	}
	if err := mig.DisableMigMode(d); !errors.Is(err, mig.ErrNeedsAdmin) {
		t.Fatalf("DisableMigMode on Ampere = %v, want ErrNeedsAdmin", err)
	}
}

// A change the driver leaves pending a reset is undone at once.
func TestEnableMigModeUndoesPendingChange(t *testing.T) {
	d := gpu(machine(t, h100_80), 0)
	var set []int
	d.SetMigModeFunc = func(mode int) (nvml.Return, nvml.Return) {
		set = append(set, mode)
		if mode == nvml.DEVICE_MIG_ENABLE {
			return nvml.ERROR_RESET_REQUIRED, nvml.SUCCESS
		}
		return nvml.SUCCESS, nvml.SUCCESS
	}
	if err := mig.EnableMigMode(d); err == nil {
		t.Fatal("EnableMigMode succeeded though the change needs a reset")
	}
	if !slices.Equal(set, []int{nvml.DEVICE_MIG_ENABLE, nvml.DEVICE_MIG_DISABLE}) {
		t.Fatalf("modes set: %v, want enable then back to disable", set)
	}
}

func TestEnableMigModeUnknownArchitecture(t *testing.T) {
	d := gpu(machine(t, h100_80), 0)
	d.GetArchitectureFunc = func() (nvml.DeviceArchitecture, nvml.Return) { return nvml.DEVICE_ARCH_UNKNOWN, nvml.SUCCESS }
	if err := mig.EnableMigMode(d); !errors.Is(err, mig.ErrNeedsAdmin) {
		t.Fatalf("EnableMigMode on an unknown architecture = %v, want ErrNeedsAdmin", err)
	}
}

func TestDisableMigModeRefusesWithInstances(t *testing.T) {
	_, d, ps := hopper(t)
	inst := create(t, d, profileNamed(t, ps, "1g.10gb"), 0)
	if err := mig.DisableMigMode(d); err == nil {
		t.Fatal("disabled MIG mode under a MIG device")
	}
	if err := mig.Destroy(d, inst); err != nil {
		t.Fatal(err)
	}
	if err := mig.DisableMigMode(d); err != nil {
		t.Fatal(err)
	}
	if migMode(t, d) != nvml.DEVICE_MIG_DISABLE {
		t.Fatal("MIG mode is still on")
	}
}

func TestMigModeNotCapable(t *testing.T) {
	var d nvml.Device = &mock.Device{GetMigModeFunc: func() (int, int, nvml.Return) { return 0, 0, nvml.ERROR_NOT_SUPPORTED }}
	if err := mig.EnableMigMode(d); !errors.Is(err, mig.ErrNotMigCapable) {
		t.Fatalf("EnableMigMode = %v, want ErrNotMigCapable", err)
	}
	if got, err := mig.List(d); got != nil || err != nil {
		t.Fatalf("List = %v, %v on a GPU without MIG", got, err)
	}
}
