package nvmock

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
)

// cudaOfDriver is the CUDA driver API version each driver branch reports
// (nvidia-smi's "CUDA Version"), for the branches a driver root here may
// hold; others keep the mock machine's.
var cudaOfDriver = map[string]int{"535": 12020, "550": 12040, "560": 12060, "570": 12080, "575": 12090, "580": 13000}

// pairWithDriverRoot makes a mock machine report the driver of the real
// driver userspace under driverRoot, when there is one: nvcdi looks for the
// libraries of the version NVML reports, and a mock saying 550.54.15 over a
// 535.261.03 install would find no driver files to give containers.
func pairWithDriverRoot(s *server.Server, driverRoot string) {
	version := nvdev.InstalledDriverVersion(driverRoot)
	if version == "" {
		return
	}
	s.DriverVersion = version
	branch, _, _ := strings.Cut(version, ".")
	if cuda, ok := cudaOfDriver[branch]; ok {
		s.CudaDriverVersion = cuda
	}
}

// The kernel module of a persistent mock machine. On a real node every
// process with an NVML session holds /dev/nvidiactl open, and the module
// cannot be unloaded while any does: `rmmod nvidia` answers "Module nvidia
// is in use" (what blocks the GPU Operator's driver upgrade), and
// `nvidia-smi -r` refuses the reset the same way. The mock models that in
// its state directory, shared by every process using the machine: each
// open session holds a flock on a holder file of its own (the kernel drops
// it when the process dies, as it closes a killed process's device
// files), UnloadDriver fails while any is held, naming the holders,
// and while the module is unloaded opening NVML fails with
// ERROR_DRIVER_NOT_LOADED, as on a node between unload and load.
const (
	mockDriverDir      = "driver"
	mockDriverLock     = "module.lock"
	mockDriverUnloaded = "unloaded"
	mockHolderPrefix   = "holder-"
)

// ErrDriverInUse is UnloadDriver's answer while NVML sessions are
// open.
var ErrDriverInUse = errors.New("rmmod: ERROR: Module nvidia is in use")

// withModuleLock runs f holding the mock module's lock: loading, unloading
// and opening a session are one at a time, as the kernel's module
// reference count is.
func withModuleLock(stateDir string, f func(dir string) error) error {
	dir := filepath.Join(stateDir, mockDriverDir)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return fmt.Errorf("mock driver module: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(dir, mockDriverLock), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("mock driver module: %w", err)
	}
	defer func() { _ = lock.Close() }()
	if err := flockFile(lock, syscall.LOCK_EX); err != nil {
		return fmt.Errorf("locking mock driver module: %w", err)
	}
	return f(dir)
}

// holdMockDriver takes a reference on the mock module for one session; the
// returned func drops it. It fails as NVML's init does while the module is
// unloaded.
func holdMockDriver(stateDir string) (release func(), err error) {
	err = withModuleLock(stateDir, func(dir string) error {
		if fileExists(filepath.Join(dir, mockDriverUnloaded)) {
			return nvdev.InitError(nvml.ERROR_DRIVER_NOT_LOADED)
		}
		f, err := os.CreateTemp(dir, mockHolderPrefix)
		if err != nil {
			return fmt.Errorf("mock driver module: %w", err)
		}
		if err := flockFile(f, syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			_ = f.Close()
			return fmt.Errorf("mock driver module: %w", err)
		}
		_, _ = fmt.Fprintf(f, "pid %d (%s)\n", os.Getpid(), filepath.Base(os.Args[0]))
		release = func() {
			_ = os.Remove(f.Name())
			_ = f.Close()
		}
		return nil
	})
	return release, err
}

// UnloadDriver unloads the mock machines' driver in stateDir, as
// `rmmod nvidia` does: it fails with ErrDriverInUse, naming the
// processes that hold a session, while any does.
func UnloadDriver(stateDir string) error {
	return withModuleLock(stateDir, func(dir string) error {
		holders, err := mockDriverHolders(dir)
		if err != nil {
			return err
		}
		if len(holders) > 0 {
			return fmt.Errorf("%w by %d NVML session(s): %s", ErrDriverInUse, len(holders), strings.Join(holders, ", "))
		}
		return os.WriteFile(filepath.Join(dir, mockDriverUnloaded), nil, 0o600)
	})
}

// LoadDriver loads the mock driver again (modprobe nvidia): sessions
// open from then on.
func LoadDriver(stateDir string) error {
	return withModuleLock(stateDir, func(dir string) error {
		err := os.Remove(filepath.Join(dir, mockDriverUnloaded))
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("loading mock driver: %w", err)
		}
		return nil
	})
}

// mockDriverHolders names the sessions holding the module. A holder file
// whose lock can be taken belongs to a process that is gone: removed.
func mockDriverHolders(dir string) ([]string, error) {
	paths, err := filepath.Glob(filepath.Join(dir, mockHolderPrefix+"*"))
	if err != nil {
		return nil, fmt.Errorf("listing mock driver holders: %w", err)
	}
	var holders []string
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			continue // released meanwhile
		}
		if flockFile(f, syscall.LOCK_EX|syscall.LOCK_NB) == nil {
			_ = os.Remove(p)
			_ = f.Close()
			continue
		}
		who, _ := io.ReadAll(f)
		_ = f.Close()
		holders = append(holders, strings.TrimSpace(string(who)))
	}
	slices.Sort(holders)
	return holders, nil
}
