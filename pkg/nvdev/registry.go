package nvdev

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Backend is an NVML other than the driver's, selected by an
// Options.Backend of Prefix followed by a name. Package nvmock registers
// go-nvml's mock machines as "mock:<machine>"; keeping them behind this
// registry leaves this package with the real NVML alone.
type Backend struct {
	// Prefix selects the backend, "mock:".
	Prefix string
	// Names lists what may follow Prefix, for Open's error.
	Names func() []string
	// Open starts a session on the named machine.
	Open func(name string, opts Options) (Interface, error)
}

// backends are the registered backends, written only by init functions
// (RegisterBackend), so Open reads them without a lock.
var backends []Backend

// RegisterBackend makes Open accept b's backends. Call it from an init
// function, before any Open.
func RegisterBackend(b Backend) {
	for _, o := range backends {
		if o.Prefix == b.Prefix {
			panic(fmt.Sprintf("nvdev: backend %q registered twice", b.Prefix))
		}
	}
	backends = append(backends, b)
}

// OpenLibrary starts a session over any NVML implementation, as Open does
// over the driver's: what a registered backend opens its machine with.
// shutdown, when not nil, runs once the session's NVML is shut down (the
// mock drops its hold on its driver module).
func OpenLibrary(lib nvml.Interface, topo Topology, shutdown func()) (Interface, error) {
	s, err := open(lib, topo)
	if err != nil {
		return nil, err
	}
	s.closed = shutdown
	return s, nil
}

// InitError is NVML's answer to Init as Open reports it: the answer and
// what an operator can do about it. A backend that fails as NVML's Init
// would (the mock with its driver module unloaded) answers the same.
func InitError(ret nvml.Return) error {
	return fmt.Errorf("initialising NVML: %w%s", ret, initHint(ret))
}
