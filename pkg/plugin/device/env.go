package device

import (
	"context"

	"github.com/gpuaas/gpu-dra-driver/pkg/mig"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/checkpoint"
)

// Env is what a kind acts on when it sets a device up or tears it down:
// the node's GPUs, the checkpoint where a MIG device's intent is staged
// before it is made, the GPUs' sharing settings and the recorder of failed
// teardowns. The prepare plane owns one and hands it to every kind, so that
// no kind knows of claims' locks, records or the kubelet.
type Env struct {
	NVML  nvdev.Interface
	Store *checkpoint.Store
	// Sharing applies time-slice and MPS settings.
	Sharing *Sharing
	// MigCaps is where the driver lists MIG capability minors.
	MigCaps string
	// Faults is told of devices whose teardown failed.
	Faults FaultRecorder
	// InUseRetry is how a MIG mode change waits for a GPU another process
	// holds; a zero First means mig.DefaultInUseRetry.
	InUseRetry mig.InUseRetry
	// Rebound is told of a GPU re-bound with a new minor number by a MIG
	// mode change (requery); nil tells none.
	Rebound func(ctx context.Context, uuid string, minor int)
}

// rebound tells Rebound of a GPU's new minor number.
func (e *Env) rebound(ctx context.Context, uuid string, minor int) {
	if e.Rebound != nil {
		e.Rebound(ctx, uuid, minor)
	}
}
