package nvdev

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
)

// BackendReal is the default backend: the NVIDIA driver's libnvidia-ml.
const BackendReal = "real"

// Options select and configure the backend.
type Options struct {
	// Backend is "real" or a registered backend's prefix and name:
	// "mock:<machine>" once package nvmock is linked in (see nvmock.Machines).
	Backend string
	// DriverRoot is where the driver is installed; libnvidia-ml is searched
	// below it. "/" on a normal host.
	DriverRoot string
	// MockSeed makes mock GPU UUIDs stable across restarts (e.g. node name).
	MockSeed string
	// MockStateDir, for a mock backend, keeps the mock machine's state (MIG
	// mode, GPU and compute instances, compute mode) in a file there, so it
	// outlives the process as a real GPU's does (see nvmock.StatePath and
	// nvmock.Reboot). Empty keeps the machine in memory, gone with the process.
	MockStateDir string
}

// Open starts the NVML session of the selected backend.
func Open(opts Options) (Interface, error) {
	if opts.Backend == "" || opts.Backend == BackendReal {
		if opts.MockStateDir != "" {
			return nil, fmt.Errorf("a mock NVML state directory (%s) needs a mock backend, not %q", opts.MockStateDir, BackendReal)
		}
		return openReal(opts.DriverRoot)
	}
	for _, b := range backends {
		if name, ok := strings.CutPrefix(opts.Backend, b.Prefix); ok {
			return b.Open(name, opts)
		}
	}
	want := fmt.Sprintf("%q", BackendReal)
	for _, b := range backends {
		want += fmt.Sprintf(" or %q+one of %v", b.Prefix, b.Names())
	}
	return nil, fmt.Errorf("unknown NVML backend %q: want %s", opts.Backend, want)
}

// libraryCandidates are the places libnvidia-ml.so.1 lives in the common
// distributions, relative to the driver root.
var libraryCandidates = []string{
	"usr/lib64/libnvidia-ml.so.1",
	"usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
	"usr/lib/aarch64-linux-gnu/libnvidia-ml.so.1",
	"usr/lib/libnvidia-ml.so.1",
	"lib64/libnvidia-ml.so.1",
}

func openReal(driverRoot string) (Interface, error) {
	path := findLibrary(driverRoot)
	s, err := open(nvml.New(nvml.WithLibraryPath(path)), sysfsTopology{})
	if errors.Is(err, ErrLibraryNotFound) {
		return nil, fmt.Errorf("%w: looked for libnvidia-ml.so.1 under driver root %q (is the NVIDIA driver installed, and --driver-root right?)", err, driverRoot)
	}
	return s, err
}

// findLibrary returns the first candidate that exists under the driver root,
// or the bare soname so the dynamic loader's own search applies.
func findLibrary(driverRoot string) string {
	for _, c := range libraryCandidates {
		p := filepath.Join(driverRoot, c)
		if fileExists(p) {
			return p
		}
	}
	return "libnvidia-ml.so.1"
}

// sysfsTopology reads the host's sysfs through Kubernetes' standard helpers.
type sysfsTopology struct{}

func (sysfsTopology) PCIeRoot(busID string) (string, error) {
	attr, err := deviceattribute.GetPCIeRootAttributeByPCIBusID(busID)
	if err != nil {
		return "", err
	}
	return *attr.Value.StringValue, nil
}

func (sysfsTopology) NUMANode(busID string) (int, error) {
	attr, err := deviceattribute.GetNUMANodeAttributeByPCIBusID(busID, deviceattribute.ScalarAttribute)
	if err != nil {
		return -1, err
	}
	if attr.Value.IntValue == nil {
		return -1, fmt.Errorf("no NUMA node for %s", busID)
	}
	return int(*attr.Value.IntValue), nil
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
