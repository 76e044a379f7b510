package nvdev_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev/nvmock"
)

const (
	oldDriver = "535.261.03"
	newDriver = "550.54.15"
)

// driverRootWith makes a driver root holding NVML's library of version,
// laid out as a host install.
func driverRootWith(t *testing.T, version string) string {
	t.Helper()
	root := t.TempDir()
	installNVML(t, root, "", version)
	return root
}

// installNVML swaps the NVML library under root from version old ("" for
// none) to version new, as a driver upgrade does.
func installNVML(t *testing.T, root, old, version string) {
	t.Helper()
	dir := filepath.Join(root, "usr/lib/x86_64-linux-gnu")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if old != "" {
		if err := os.Remove(filepath.Join(dir, "libnvidia-ml.so."+old)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "libnvidia-ml.so."+version), nil, 0o644); err != nil {
		t.Fatal(err)
	}
}

// Issue 25 item 4: an NVML session held for the plugin's whole life keeps
// the driver from being unloaded (`rmmod nvidia`: "Module nvidia is in
// use", the GPU Operator's driver upgrade stuck) and a GPU from being
// reset. The mock driver refuses its unload while a session is open,
// naming who holds it; once the session is released the unload goes
// through and the GPUs answer ErrReleased. Reacquire after a reset waits
// for the driver to be loaded again and opens a session in the same
// process; after an upgrade it says a new process is needed, whose
// session is of the new version.
func TestReleaseLetsTheDriverBeResetAndUpgraded(t *testing.T) {
	stateDir, root := t.TempDir(), driverRootWith(t, oldDriver)
	opts := nvdev.Options{Backend: "mock:dgxa100", MockSeed: "node-1", MockStateDir: stateDir, DriverRoot: root}
	lib, err := nvdev.Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	r := nvdev.NewReleasable(lib, opts)
	defer func() { _ = r.Shutdown() }()
	uuid := r.GPUs()[0].UUID

	err = nvmock.UnloadDriver(stateDir)
	if !errors.Is(err, nvmock.ErrDriverInUse) || !strings.Contains(err.Error(), "pid ") {
		t.Fatalf("unload with a session open: %v, want %v naming the holder", err, nvmock.ErrDriverInUse)
	}

	// A reset: released, the driver reloaded, reacquired in this process.
	release(t, r, stateDir, uuid)
	waiting := make(chan error, 1)
	done := make(chan error, 1)
	go func() {
		done <- r.Reacquire(context.Background(), time.Millisecond, func(err error) {
			select {
			case waiting <- err:
			default: // the test has seen one
			}
		})
	}()
	if err := <-waiting; !nvdev.DriverNotReady(err) {
		t.Errorf("reacquiring while the driver is unloaded waits with %v, want a driver-not-ready reason", err)
	}
	if err := nvmock.LoadDriver(stateDir); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Reacquire: %v", err)
	}
	if _, err := r.DeviceByUUID(uuid); err != nil {
		t.Errorf("DeviceByUUID after reacquiring: %v", err)
	}
	if err := nvmock.UnloadDriver(stateDir); !errors.Is(err, nvmock.ErrDriverInUse) {
		t.Errorf("unload with the new session open: %v, want %v", err, nvmock.ErrDriverInUse)
	}

	// An upgrade: the library of another version is not this process's.
	release(t, r, stateDir, uuid)
	installNVML(t, root, oldDriver, newDriver)
	if err := nvmock.LoadDriver(stateDir); err != nil {
		t.Fatal(err)
	}
	if err := r.Reacquire(context.Background(), time.Millisecond, func(error) {}); !errors.Is(err, nvdev.ErrNewProcessNeeded) {
		t.Fatalf("Reacquire after an upgrade: %v, want %v", err, nvdev.ErrNewProcessNeeded)
	}
	next, err := nvdev.Open(opts) // the new process
	if err != nil {
		t.Fatal(err)
	}
	if v := next.System().DriverVersion; v != newDriver {
		t.Errorf("driver version of the new process = %q, want %q", v, newDriver)
	}
	if err := next.Shutdown(); err != nil {
		t.Fatal(err)
	}
	if err := nvmock.UnloadDriver(stateDir); err != nil {
		t.Errorf("unload after every session ended: %v (a session leaked its hold)", err)
	}
}

// release releases r and checks that the GPUs answer ErrReleased and the
// driver can be unloaded.
func release(t *testing.T, r *nvdev.Releasable, stateDir, uuid string) {
	t.Helper()
	if err := r.Release(); err != nil {
		t.Fatal(err)
	}
	if _, err := r.DeviceByUUID(uuid); !errors.Is(err, nvdev.ErrReleased) {
		t.Errorf("DeviceByUUID while released: %v, want %v", err, nvdev.ErrReleased)
	}
	if got := r.GPUs(); len(got) != 8 {
		t.Errorf("GPUs while released: %d, want the 8 last read", len(got))
	}
	if err := nvmock.UnloadDriver(stateDir); err != nil {
		t.Fatalf("unload after the release: %v", err)
	}
}

// A process that dies holding a session does not hold the driver: the
// kernel closes its files.
func TestUnloadIgnoresHoldersThatAreGone(t *testing.T) {
	stateDir := t.TempDir()
	lib, err := nvdev.Open(nvdev.Options{Backend: "mock:dgxa100", MockSeed: "n", MockStateDir: stateDir})
	if err != nil {
		t.Fatal(err)
	}
	if err := lib.Shutdown(); err != nil {
		t.Fatal(err)
	}
	// A holder file left behind unlocked, as by a killed process.
	if err := os.WriteFile(filepath.Join(stateDir, "driver", "holder-killed"), []byte("pid 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := nvmock.UnloadDriver(stateDir); err != nil {
		t.Fatalf("unload: %v", err)
	}
	if _, err := nvdev.Open(nvdev.Options{Backend: "mock:dgxa100", MockSeed: "n", MockStateDir: stateDir}); !nvdev.DriverNotReady(err) {
		t.Errorf("open with the driver unloaded: %v, want driver not loaded", err)
	}
}

func TestInstalledDriverVersion(t *testing.T) {
	root := t.TempDir()
	if v := nvdev.InstalledDriverVersion(root); v != "" {
		t.Errorf("empty root: %q", v)
	}
	installNVML(t, root, "", "550.9.1")
	installNVML(t, root, "", "550.10.1") // half an upgrade: the newest counts
	if v := nvdev.InstalledDriverVersion(root); v != "550.10.1" {
		t.Errorf("InstalledDriverVersion = %q, want 550.10.1", v)
	}
}

// Where the driver root does not tell the version (a layout the watch
// does not read), an upgrade shows as NVML's answer that the library and
// the kernel module differ: that too takes a new process.
func TestReacquireOnAMismatchedModuleNeedsANewProcess(t *testing.T) {
	opts := nvdev.Options{Backend: "mock:dgxa100", MockSeed: "n"}
	lib, err := nvdev.Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	r := nvdev.NewReleasable(lib, opts)
	if err := r.Release(); err != nil {
		t.Fatal(err)
	}
	defer nvdev.SetOpen(func(nvdev.Options) (nvdev.Interface, error) {
		return nil, fmt.Errorf("initialising NVML: %w", nvml.ERROR_LIB_RM_VERSION_MISMATCH)
	})()
	if err := r.Reacquire(context.Background(), time.Millisecond, func(error) {}); !errors.Is(err, nvdev.ErrNewProcessNeeded) {
		t.Errorf("Reacquire over a mismatched module: %v, want %v", err, nvdev.ErrNewProcessNeeded)
	}
}
