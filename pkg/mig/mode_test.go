package mig_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/gpuaas/gpu-dra-driver/pkg/mig"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev/nvmock"
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

// persistentGPU is GPU i of a persistent mock machine (pkg/nvdev), whose
// MIG mode changes fail as injected; dir is its state directory.
func persistentGPU(t *testing.T, i int) (nvdev.Interface, nvml.Device, string) {
	t.Helper()
	dir := t.TempDir()
	lib, err := nvdev.Open(nvdev.Options{Backend: "mock:dgxh100", MockSeed: "node-a", MockStateDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	dev, err := lib.DeviceByUUID(lib.GPUs()[i].UUID)
	if err != nil {
		t.Fatal(err)
	}
	return lib, dev, dir
}

// fastRetry waits as DefaultInUseRetry does, in less time.
func fastRetry(lib nvdev.Interface, within time.Duration) mig.InUseRetry {
	return mig.InUseRetry{Within: within, First: 5 * time.Millisecond, ProcessName: lib.NVML().SystemGetProcessName}
}

// Issue 25 item 2: a GPU held for a moment (the next changes answer
// ERROR_IN_USE) gets its MIG mode once it is free.
func TestRetryInUseThenSucceeds(t *testing.T) {
	lib, dev, dir := persistentGPU(t, 2)
	if err := nvmock.SetMigModeInUse(dir, "2", 3); err != nil {
		t.Fatal(err)
	}
	if err := mig.RetryInUse(context.Background(), dev, fastRetry(lib, time.Minute), mig.EnableMigMode); err != nil {
		t.Fatalf("EnableMigMode after three refusals: %v", err)
	}
	if migMode(t, dev) != nvml.DEVICE_MIG_ENABLE {
		t.Fatal("MIG mode is still off")
	}
}

// A GPU held for longer than the wait: an error that says so, names the
// GPU and the process NVML lists on it, and the mode is as it was.
func TestRetryInUseGivesUpNamingTheHolder(t *testing.T) {
	lib, dev, dir := persistentGPU(t, 1)
	if err := nvmock.SetHolder(dir, "1", nvmock.Process{PID: 4242, Name: "dcgm-exporter"}, true); err != nil {
		t.Fatal(err)
	}
	err := mig.RetryInUse(context.Background(), dev, fastRetry(lib, 50*time.Millisecond), mig.EnableMigMode)
	var inUse *mig.InUseError
	if !errors.As(err, &inUse) || !errors.Is(err, nvml.ERROR_IN_USE) {
		t.Fatalf("EnableMigMode on a held GPU = %v, want an InUseError", err)
	}
	for _, want := range []string{lib.GPUs()[1].UUID, "pid 4242 (dcgm-exporter)", "another process holds the GPU"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if inUse.Tries < 2 {
		t.Errorf("tried %d times, want retries", inUse.Tries)
	}
	if cur, pend, _ := dev.GetMigMode(); cur != nvml.DEVICE_MIG_DISABLE || pend != cur {
		t.Errorf("MIG mode %d pending %d after the refusals, want disabled", cur, pend)
	}
}

// NVML may list no process on a GPU that is held (a monitoring agent with
// the device open runs no CUDA work): the error says what may hold it.
func TestRetryInUseWithoutAListedHolder(t *testing.T) {
	lib, dev, dir := persistentGPU(t, 0)
	if err := nvmock.SetMigModeInUse(dir, "0", 1000); err != nil {
		t.Fatal(err)
	}
	err := mig.RetryInUse(context.Background(), dev, fastRetry(lib, 0), mig.EnableMigMode)
	if !errors.Is(err, nvml.ERROR_IN_USE) || !strings.Contains(err.Error(), "NVML lists no process on it") {
		t.Fatalf("error %v: want ERROR_IN_USE saying NVML lists no process", err)
	}
}

// The kubelet's cancel ends the wait.
func TestRetryInUseStopsWithTheContext(t *testing.T) {
	lib, dev, dir := persistentGPU(t, 0)
	if err := nvmock.SetMigModeInUse(dir, "0", 1000); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := mig.RetryInUse(ctx, dev, fastRetry(lib, time.Hour), mig.EnableMigMode)
	if !errors.Is(err, context.Canceled) || !errors.Is(err, nvml.ERROR_IN_USE) {
		t.Fatalf("error %v: want the refusal and the cancel", err)
	}
}

// Other failures are not retried: a change left pending a reset is put
// back at once, and the error says so.
func TestEnableMigModePendingResetIsPutBack(t *testing.T) {
	lib, dev, dir := persistentGPU(t, 4)
	if err := nvmock.SetMigModePending(dir, "4", true); err != nil {
		t.Fatal(err)
	}
	err := mig.RetryInUse(context.Background(), dev, fastRetry(lib, time.Minute), mig.EnableMigMode)
	if !errors.Is(err, mig.ErrPendingReset) || !errors.Is(err, nvml.ERROR_RESET_REQUIRED) {
		t.Fatalf("EnableMigMode left pending = %v, want ErrPendingReset with RESET_REQUIRED", err)
	}
	if cur, pend, _ := dev.GetMigMode(); cur != nvml.DEVICE_MIG_DISABLE || pend != nvml.DEVICE_MIG_DISABLE {
		t.Errorf("MIG mode %d pending %d, want disabled with nothing pending", cur, pend)
	}
	// A reset now changes nothing: no mode was left waiting for it.
	if err := nvmock.ResetGPU(dir, "4"); err != nil {
		t.Fatal(err)
	}
	if migMode(t, dev) != nvml.DEVICE_MIG_DISABLE {
		t.Error("a reset switched the GPU's MIG mode")
	}
}

// A switch left pending by a plugin killed before it put the mode back is
// cancelled by the next change to the current mode, so no reset switches
// the GPU under the claim that asked for that mode.
func TestSetMigModeCancelsAPendingSwitchLeftBehind(t *testing.T) {
	_, dev, dir := persistentGPU(t, 6)
	if err := nvmock.SetMigModePending(dir, "6", true); err != nil {
		t.Fatal(err)
	}
	if _, ret := dev.SetMigMode(nvml.DEVICE_MIG_ENABLE); ret != nvml.SUCCESS { // then killed
		t.Fatal(ret)
	}
	if err := mig.DisableMigMode(dev); err != nil {
		t.Fatal(err)
	}
	if cur, pend, _ := dev.GetMigMode(); cur != nvml.DEVICE_MIG_DISABLE || pend != nvml.DEVICE_MIG_DISABLE {
		t.Fatalf("MIG mode %d pending %d, want disabled with nothing pending", cur, pend)
	}
}

// Found by the crash test with hardware faults (CI, seed
// 1795807951348312791): a pending switch left behind is cancelled by
// asking for the current mode, and that call too is refused while another
// process holds the GPU. The refusal changed nothing, so it is waited out
// like any other, not returned as a GPU left unsure.
func TestCancellingAPendingSwitchWaitsOutAHolder(t *testing.T) {
	lib, dev, dir := persistentGPU(t, 6)
	if err := nvmock.SetMigModePending(dir, "6", true); err != nil {
		t.Fatal(err)
	}
	if _, ret := dev.SetMigMode(nvml.DEVICE_MIG_ENABLE); ret != nvml.SUCCESS { // then killed
		t.Fatal(ret)
	}
	if err := nvmock.SetMigModePending(dir, "6", false); err != nil {
		t.Fatal(err)
	}
	if err := nvmock.SetMigModeInUse(dir, "6", 2); err != nil {
		t.Fatal(err)
	}
	if err := mig.RetryInUse(context.Background(), dev, fastRetry(lib, time.Minute), mig.DisableMigMode); err != nil {
		t.Fatalf("DisableMigMode with a switch left pending and the GPU held twice: %v", err)
	}
	if cur, pend, _ := dev.GetMigMode(); cur != nvml.DEVICE_MIG_DISABLE || pend != nvml.DEVICE_MIG_DISABLE {
		t.Fatalf("MIG mode %d pending %d, want disabled with nothing pending", cur, pend)
	}
}
