package main

import (
	"errors"
	"testing"
	"time"

	"github.com/gpuaas/gpu-dra-driver/pkg/cdi/cditest"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev/nvmock"
)

// startRegistered starts the plugin on a mock machine and plays the
// kubelet's registration; it returns once every probe serves.
func startRegistered(t *testing.T, f flags) *running {
	t.Helper()
	r := startPlugin(t, f)
	for deadline := time.Now().Add(30 * time.Second); !socketExists(f.registrarDir); time.Sleep(20 * time.Millisecond) {
		if exited, err := r.exited(); exited || time.Now().After(deadline) {
			t.Fatalf("the plugin did not start (exited %v: %v)", exited, err)
		}
	}
	register(t, f.registrarDir)
	waitProbes(t, f, probes{"SERVING", "SERVING", "SERVING"})
	return r
}

func waitProbes(t *testing.T, f flags, want probes) {
	t.Helper()
	var got probes
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if got = probeAll(t, f.healthAddr); got == want {
			return
		}
	}
	t.Fatalf("probes (liveness, startup, readiness) = %v, want %v", got, want)
}

// Issue 25 item 4: `kubectl exec <plugin pod> -- dra-kubelet-plugin
// --release-gpus` makes the running plugin let go of the driver (the mock
// driver then unloads, as rmmod would), alive but not ready; the command
// returns only once it has. --reacquire-gpus takes the GPUs back, ready.
func TestReleaseAndReacquireFromTheCommandLine(t *testing.T) {
	f := testFlags(t, t.TempDir())
	f.nvml = "mock:dgxh100"
	startRegistered(t, f)
	if err := nvmock.UnloadDriver(f.mockStateDir); !errors.Is(err, nvmock.ErrDriverInUse) {
		t.Fatalf("unload while the plugin runs: %v, want %v", err, nvmock.ErrDriverInUse)
	}

	release := f
	release.releaseGPUs = true
	if code := requestMaintenance(release); code != 0 {
		t.Fatalf("--release-gpus exited %d", code)
	}
	if err := nvmock.UnloadDriver(f.mockStateDir); err != nil {
		t.Fatalf("unload after --release-gpus returned: %v", err)
	}
	waitProbes(t, f, probes{"SERVING", "SERVING", "NOT_SERVING"})

	if err := nvmock.LoadDriver(f.mockStateDir); err != nil {
		t.Fatal(err)
	}
	reacquire := f
	reacquire.reacquireGPUs = true
	if code := requestMaintenance(reacquire); code != 0 {
		t.Fatalf("--reacquire-gpus exited %d", code)
	}
	waitProbes(t, f, probes{"SERVING", "SERVING", "SERVING"})
}

// After a driver upgrade the run ends asking for a new process (main then
// executes the plugin again), which alone can load the new NVML library.
func TestDriverUpgradeEndsTheRunForANewProcess(t *testing.T) {
	f := testFlags(t, t.TempDir())
	f.nvml = "mock:dgxh100"
	root := cditest.NewDriverRoot(t, "535.261.03")
	f.driverRoot = root.Root
	r := startRegistered(t, f)
	release := f
	release.releaseGPUs = true
	if code := requestMaintenance(release); code != 0 {
		t.Fatalf("--release-gpus exited %d", code)
	}
	root.Upgrade(t, "550.54.15")
	select {
	case <-r.done:
	case <-time.After(30 * time.Second):
		t.Fatal("the plugin did not take the new driver up")
	}
	if !errors.Is(r.err, nvdev.ErrNewProcessNeeded) {
		t.Fatalf("the run ended with %v, want %v", r.err, nvdev.ErrNewProcessNeeded)
	}
}
