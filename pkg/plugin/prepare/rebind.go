package prepare

import (
	"context"

	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/device"
)

// GPURebound makes the published devices of a GPU carry its new minor
// number: those State plans claims with, and through onRebound those the
// driver publishes (and the health monitor registers the GPU for its
// events again). The callers have the GPU's handle renewed already
// (requery, rereadMinor's WithHandle).
func (s *State) GPURebound(ctx context.Context, uuid string, minor int) {
	s.devMu.Lock()
	changed := false
	next := make(map[string]*device.AllocatableDevice, len(s.devices))
	for name, d := range s.devices {
		if d.GPU.UUID == uuid && d.GPU.Minor != minor {
			d, changed = device.WithMinor(d, minor), true
		}
		next[name] = d
	}
	s.devices = next
	s.devMu.Unlock()
	// Told once per re-bind, not once per device of a claim on the GPU.
	if changed && s.onRebound != nil {
		s.onRebound(ctx, uuid, minor)
	}
}

// OnRebound has f told of each GPU re-bound with a new minor number (the
// driver republishes its devices); set before Restore, which may re-bind.
func (s *State) OnRebound(f func(ctx context.Context, uuid string, minor int)) { s.onRebound = f }
