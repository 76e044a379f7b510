package nvdev_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
)

// Issue 25 item 5: with the GPU Operator the driver root
// (/run/nvidia/driver) is empty, then holds a driver whose module is not
// loaded yet, for minutes after the node boots. That is a wait, not a
// failure: OpenWhenReady says why it waits and opens once the driver is
// there; a broken driver still fails at once.
func TestOpenWhenReadyWaitsForTheDriver(t *testing.T) {
	answers := []error{
		fmt.Errorf("%w: looked under driver root %q", nvdev.ErrLibraryNotFound, "/run/nvidia/driver"),
		fmt.Errorf("initialising NVML: %w", nvml.ERROR_DRIVER_NOT_LOADED),
	}
	defer nvdev.SetOpen(func(opts nvdev.Options) (nvdev.Interface, error) {
		if len(answers) > 0 {
			err := answers[0]
			answers = answers[1:]
			return nil, err
		}
		return nvdev.Open(nvdev.Options{Backend: "mock:dgxa100", MockSeed: "n"})
	})()
	var waited []error
	lib, err := nvdev.OpenWhenReady(context.Background(), nvdev.Options{}, time.Millisecond, func(err error) { waited = append(waited, err) })
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lib.Shutdown() }()
	if len(waited) != 2 || len(lib.GPUs()) != 8 {
		t.Errorf("waited for %v, then opened %d GPUs; want two waits and 8 GPUs", waited, len(lib.GPUs()))
	}

	broken := fmt.Errorf("initialising NVML: %w", nvml.ERROR_LIB_RM_VERSION_MISMATCH)
	defer nvdev.SetOpen(func(nvdev.Options) (nvdev.Interface, error) { return nil, broken })()
	if _, err := nvdev.OpenWhenReady(context.Background(), nvdev.Options{}, time.Millisecond, func(error) {
		t.Error("waited on a broken driver")
	}); !errors.Is(err, nvml.ERROR_LIB_RM_VERSION_MISMATCH) {
		t.Errorf("broken driver: %v", err)
	}
}

// The real backend on an empty driver root waits (the library is not
// found), until the context ends.
func TestOpenWhenReadyOnAnEmptyDriverRoot(t *testing.T) {
	root := filepath.Join(t.TempDir(), "run", "nvidia", "driver")
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	var waits int
	_, err := nvdev.OpenWhenReady(ctx, nvdev.Options{Backend: nvdev.BackendReal, DriverRoot: root}, 50*time.Millisecond, func(error) { waits++ })
	if !errors.Is(err, context.DeadlineExceeded) || waits < 2 {
		t.Errorf("after %d waits: %v; want waiting until the context ends", waits, err)
	}
}
