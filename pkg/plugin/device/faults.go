package device

import (
	"context"

	"github.com/gpuaas/gpu-dra-driver/pkg/health"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/checkpoint"
)

// FaultRecorder is told when tearing a device down fails and when a retry
// succeeds; the health monitor taints the device meanwhile.
type FaultRecorder interface {
	SetCleanupBlocked(ctx context.Context, gpu string, scope *health.MIGScope, err error)
}

// NoFaults records nothing: health monitoring is off.
type NoFaults struct{}

func (NoFaults) SetCleanupBlocked(context.Context, string, *health.MIGScope, error) {}

// MIGScope is the MIG device a device stands for, nil for the others.
func (d *AllocatableDevice) MIGScope() *health.MIGScope { return d.Kind.MIGScope() }

// cleanupScope is the MIG device a checkpoint device's teardown is about.
func cleanupScope(d *checkpoint.Device) *health.MIGScope {
	switch {
	case d.CreatedMIG != nil:
		return &health.MIGScope{GIProfileID: d.CreatedMIG.GIProfileID, Placement: d.CreatedMIG.Placement, GIID: d.CreatedMIG.GIID}
	case d.MIGIntent != nil:
		return &health.MIGScope{GIProfileID: d.MIGIntent.GIProfileID, Placement: d.MIGIntent.Placement}
	}
	return nil
}
