package nvdev

import (
	"context"
	"errors"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// DriverRetryInterval is how often OpenWhenReady tries again while the
// driver is not there yet.
const DriverRetryInterval = 5 * time.Second

// DriverNotReady reports whether err from Open means the NVIDIA driver is
// not there yet rather than broken: no libnvidia-ml under the driver root,
// or the kernel module not loaded. Both are what a node shows until the GPU
// Operator's driver container has installed the driver under
// /run/nvidia/driver and loaded the module, which takes minutes at boot.
func DriverNotReady(err error) bool {
	return errors.Is(err, ErrLibraryNotFound) || errors.Is(err, nvml.ERROR_DRIVER_NOT_LOADED)
}

// openFunc is Open; tests replace it.
var openFunc = Open

// OpenWhenReady opens the NVML session, waiting, for as long as ctx allows,
// while the driver is not ready (DriverNotReady): the plugin then waits as
// a readiness state, not a crash loop. waiting is called with the reason
// at every try that finds it not ready. Any other error is returned at
// once.
func OpenWhenReady(ctx context.Context, opts Options, retry time.Duration, waiting func(error)) (Interface, error) {
	if retry <= 0 {
		retry = DriverRetryInterval
	}
	for {
		lib, err := openFunc(opts)
		if err == nil || !DriverNotReady(err) {
			return lib, err
		}
		waiting(err)
		t := time.NewTimer(retry)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, errors.Join(ctx.Err(), err)
		case <-t.C:
		}
	}
}
