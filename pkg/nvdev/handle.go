package nvdev

import (
	"errors"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// A GPU the driver re-binds (nvmlDeviceSetMigMode "may unbind or reset the
// device"; mig-manager re-binds static-MIG GPUs) may leave the handles a
// process cached from before stale. NVML does not say what a stale handle
// answers; GPU_IS_LOST and INVALID_ARGUMENT ("device is invalid") are what
// it answers for a handle it no longer knows, so either, from a cached
// handle, is worth one more try on a handle asked for again before the GPU
// is taken for lost. A GPU that did fall off the bus fails that try too.

// maybeStale tells whether err is an answer a stale handle may give.
func maybeStale(err error) bool {
	var ret nvml.Return
	return errors.As(err, &ret) && (ret == nvml.ERROR_GPU_IS_LOST || ret == nvml.ERROR_INVALID_ARGUMENT)
}

// WithHandle runs call on the GPU's cached handle. If call fails as a
// stale handle may (it returns or wraps an nvml.Return of GPU_IS_LOST or
// INVALID_ARGUMENT), the handle is forgotten and call runs once more on one
// NVML is asked for again, whose answer stands. renewed is true when that
// second call succeeded: the cached handle was stale, and whatever else
// was obtained through it (an event registration) may be too.
func WithHandle(lib Interface, uuid string, call func(nvml.Device) error) (renewed bool, err error) {
	dev, err := lib.DeviceByUUID(uuid)
	if err != nil {
		return false, err
	}
	if err = call(dev); !maybeStale(err) {
		return false, err
	}
	lib.ForgetHandle(uuid)
	if dev, err = lib.DeviceByUUID(uuid); err != nil {
		return false, err
	}
	if err = call(dev); err != nil {
		return false, err
	}
	return true, nil
}

// Returned is ret as an error, nil for SUCCESS: what a WithHandle call
// returns for an NVML answer.
func Returned(ret nvml.Return) error {
	if ret == nvml.SUCCESS {
		return nil
	}
	return ret
}
