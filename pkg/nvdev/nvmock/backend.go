// Package nvmock is go-nvml's mock machines (dgxa100, dgxh100, dgxh200,
// dgxb200) completed for our device model, as nvdev's "mock:<machine>"
// backend: kept in memory, or persistent in a state directory that every
// process using the machine shares (MIG layout, MIG mode, the driver
// module, faults and events injected by hack/mocknvml), so the simulated
// hardware outlives the plugin as a real GPU does. It stands in only for
// NVML's answers; pkg/nvdev reads them as it reads the real library's.
package nvmock

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
)

// Prefix selects one of go-nvml's mock machines: "mock:dgxh100".
const Prefix = "mock:"

// Linking this package in makes nvdev.Open accept "mock:<machine>": every
// binary with a --nvml flag imports it, so the flag takes a mock machine
// wherever it did.
func init() {
	nvdev.RegisterBackend(nvdev.Backend{Prefix: Prefix, Names: Machines, Open: open})
}

// open starts an NVML session on a mock machine: kept in memory, or, with
// opts.MockStateDir, persistent and shared by every process using the
// directory.
func open(machine string, opts nvdev.Options) (nvdev.Interface, error) {
	lib, release, err := NewLibrary(machine, opts)
	if err != nil {
		return nil, err
	}
	s, err := nvdev.OpenLibrary(lib, mockTopology{}, release)
	if err != nil {
		if release != nil {
			release()
		}
		return nil, err
	}
	return s, nil
}

// NewLibrary builds the NVML library of a mock machine as open gives it
// to a session: completed, paired with the driver under opts.DriverRoot,
// and, with opts.MockStateDir, persistent, holding the mock driver module
// until release is called (nil for a machine kept in memory). It is what
// the simulated libnvidia-ml.so.1 (hack/nvmlshim) answers C callers from.
func NewLibrary(machine string, opts nvdev.Options) (lib nvml.Interface, release func(), err error) {
	s, err := newMachine(machine, opts.MockSeed)
	if err != nil {
		return nil, nil, err
	}
	pairWithDriverRoot(s, opts.DriverRoot)
	if opts.MockStateDir == "" {
		completeUse(s, idleUse{}, nil)
		return s, nil, nil
	}
	// The session holds the mock driver module, as a real one holds
	// /dev/nvidiactl, until Shutdown (see UnloadDriver).
	release, err = holdMockDriver(opts.MockStateDir)
	if err != nil {
		return nil, nil, err
	}
	if err := persistMock(s, opts.MockStateDir, machine, opts.MockSeed); err != nil {
		release()
		return nil, nil, fmt.Errorf("opening persistent mock machine %s: %w", machine, err)
	}
	return s, release, nil
}
