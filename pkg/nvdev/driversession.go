package nvdev

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// ErrReleased is what every call that needs the GPUs answers while the
// plugin has let go of them for a GPU reset or a driver upgrade.
var ErrReleased = errors.New("GPUs released for maintenance (NVML is shut down so that the driver can be reset or upgraded); " +
	"run `dra-kubelet-plugin --reacquire-gpus` in the plugin pod once it is done")

// ErrNewProcessNeeded is Reacquire's answer when the driver installed
// now is not the version this process loaded: a process cannot unload a
// library it has bound symbols of (glibc keeps it mapped for good, and
// dlopen of the same path hands the old one back), so the old NVML would
// run against the new kernel module. Only a new process (the plugin
// executes itself again) loads the new one.
var ErrNewProcessNeeded = errors.New("a new process is needed to load the new driver's NVML library")

// Releasable is an Interface whose NVML session can be let go of and
// opened again while the plugin runs. A session holds /dev/nvidiactl and
// an event set for as long as it is open, which blocks `rmmod nvidia` (a
// driver upgrade) and `nvidia-smi -r` (a GPU reset); Release shuts it
// down, Reacquire opens a fresh one, through the same wait for the driver
// as at start and with the library the driver root holds then (a new
// version after an upgrade).
//
// Callers that hold on to what a session gave them (a device handle, the
// NVML library for an event set) must stop using it before Release: the
// plugin stops its health monitor and waits for prepares in flight first.
type Releasable struct {
	opts Options
	// loaded is the version of the library under the driver root when
	// the first session was opened: the one this process holds.
	loaded string

	mu sync.RWMutex
	// cur is the open session, nil while released; last is the latest
	// one, whose GPUs and system information are answered meanwhile.
	cur, last Interface
}

var _ Interface = (*Releasable)(nil)

// NewReleasable wraps the open session lib, opened with opts.
func NewReleasable(lib Interface, opts Options) *Releasable {
	return &Releasable{opts: opts, loaded: InstalledDriverVersion(opts.DriverRoot), cur: lib, last: lib}
}

// Released reports whether the session is let go of.
func (r *Releasable) Released() bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.cur == nil
}

// Release shuts the NVML session down; the GPUs and the driver are free
// for a reset or an unload until Reacquire. Releasing twice is a no-op.
func (r *Releasable) Release() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cur == nil {
		return nil
	}
	err := r.cur.Shutdown()
	// Released even if NVML complained: the session is not used again.
	r.cur = nil
	return err
}

// Reacquire opens a new session, waiting while the driver is not ready
// (OpenWhenReady, with waiting told why) for as long as ctx allows. An
// open session is kept. A driver of another version than the process
// loaded is ErrNewProcessNeeded, with the mock too, which follows the
// real library's rule.
func (r *Releasable) Reacquire(ctx context.Context, retry time.Duration, waiting func(error)) error {
	if !r.Released() {
		return nil
	}
	if now := InstalledDriverVersion(r.opts.DriverRoot); r.loaded != "" && now != "" && now != r.loaded {
		return fmt.Errorf("driver %s installed, this process holds %s: %w", now, r.loaded, ErrNewProcessNeeded)
	}
	lib, err := OpenWhenReady(ctx, r.opts, retry, waiting)
	if errors.Is(err, nvml.ERROR_LIB_RM_VERSION_MISMATCH) {
		// The library this process holds is not the loaded module's: a
		// driver upgraded where its version is not read from the files.
		return fmt.Errorf("reopening NVML: %w: %w", err, ErrNewProcessNeeded)
	}
	if err != nil {
		return fmt.Errorf("reopening NVML: %w", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cur != nil { // another Reacquire won
		_ = lib.Shutdown()
		return nil
	}
	r.cur, r.last = lib, lib
	return nil
}

func (r *Releasable) latest() Interface {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.last
}

// System, GPUs and Problems answer what the latest session read, released
// or not: they are facts of the node, not calls to the driver.
func (r *Releasable) System() SystemInfo  { return r.latest().System() }
func (r *Releasable) GPUs() []GPU         { return r.latest().GPUs() }
func (r *Releasable) Problems() []Problem { return r.latest().Problems() }

// DeviceByUUID answers ErrReleased while released.
func (r *Releasable) DeviceByUUID(uuid string) (nvml.Device, error) {
	r.mu.RLock()
	cur := r.cur
	r.mu.RUnlock()
	if cur == nil {
		return nil, fmt.Errorf("getting NVML handle of %s: %w", uuid, ErrReleased)
	}
	return cur.DeviceByUUID(uuid)
}

// ForgetHandle drops the open session's cached handle; while released
// there is none to drop.
func (r *Releasable) ForgetHandle(uuid string) {
	r.mu.RLock()
	cur := r.cur
	r.mu.RUnlock()
	if cur != nil {
		cur.ForgetHandle(uuid)
	}
}

// NVML is the latest session's library; while released it is shut down
// and its calls fail, so callers must not use it then.
func (r *Releasable) NVML() nvml.Interface { return r.latest().NVML() }

// Shutdown ends the session, if one is open.
func (r *Releasable) Shutdown() error { return r.Release() }
