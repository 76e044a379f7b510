// Package mps runs one node-local MPS control daemon per GPU for claims
// that share a GPU with enforced limits. The daemon is a child of the
// plugin's node, started from the driver root's nvidia-cuda-mps-control with
// fixed arguments, health-checked before each new client, and stopped when
// the GPU's last MPS claim is gone. No API-server object is involved.
package mps

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/gpuaas/gpu-dra-driver/pkg/timeslice"
)

// ControlBinary is the MPS control daemon.
const ControlBinary = "nvidia-cuda-mps-control"

// Client environment the CUDA runtime reads.
const (
	EnvPipeDir        = "CUDA_MPS_PIPE_DIRECTORY"
	EnvLogDir         = "CUDA_MPS_LOG_DIRECTORY"
	EnvPinnedMemLimit = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
	EnvThreads        = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
)

// Daemons manages the control daemons of a node.
type Daemons struct {
	Runner     timeslice.Runner
	DriverRoot string
	// Dir holds one pipe and one log directory per GPU.
	Dir string
	// Ready bounds the wait for a started daemon to answer.
	Ready time.Duration
}

// PipeDir is where the daemon of a GPU listens; clients need it mounted.
func (d *Daemons) PipeDir(gpu string) string { return filepath.Join(d.Dir, gpu, "pipe") }

func (d *Daemons) logDir(gpu string) string { return filepath.Join(d.Dir, gpu, "log") }

// control builds a control command for one GPU's daemon.
func (d *Daemons) control(gpu string, args []string, stdin string) (timeslice.Cmd, error) {
	if err := timeslice.ValidateUUID(gpu); err != nil {
		return timeslice.Cmd{}, err
	}
	bin, err := timeslice.FindBinary(d.DriverRoot, ControlBinary)
	if err != nil {
		return timeslice.Cmd{}, fmt.Errorf("MPS: %w", err)
	}
	env := []string{"CUDA_VISIBLE_DEVICES=" + gpu, EnvPipeDir + "=" + d.PipeDir(gpu), EnvLogDir + "=" + d.logDir(gpu)}
	return timeslice.Cmd{Path: bin, Args: args, Env: env, Stdin: stdin}, nil
}

// Available reports whether daemons can be started here at all, so prepare
// fails before it changes anything.
func (d *Daemons) Available() error {
	if _, err := timeslice.FindBinary(d.DriverRoot, ControlBinary); err != nil {
		return fmt.Errorf("MPS: %w", err)
	}
	return nil
}

// Start starts the daemon of a GPU in the background (-d) and waits until
// it answers.
func (d *Daemons) Start(ctx context.Context, gpu string) error {
	cmd, err := d.control(gpu, []string{"-d"}, "")
	if err != nil {
		return err
	}
	for _, dir := range []string{d.PipeDir(gpu), d.logDir(gpu)} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("MPS directory: %w", err)
		}
	}
	if _, err := d.Runner.Run(ctx, cmd); err != nil {
		return fmt.Errorf("starting MPS daemon of %s: %w", gpu, err)
	}
	return d.waitReady(ctx, gpu)
}

// Healthy asks the daemon a harmless question.
func (d *Daemons) Healthy(ctx context.Context, gpu string) error {
	cmd, err := d.control(gpu, nil, "get_default_active_thread_percentage\n")
	if err != nil {
		return err
	}
	if _, err := d.Runner.Run(ctx, cmd); err != nil {
		return fmt.Errorf("MPS daemon of %s not answering: %w", gpu, err)
	}
	return nil
}

// Ensure restarts a daemon that stopped answering.
func (d *Daemons) Ensure(ctx context.Context, gpu string) error {
	if d.Healthy(ctx, gpu) == nil {
		return nil
	}
	return d.Start(ctx, gpu)
}

// Stop asks the daemon to quit and removes its directories.
func (d *Daemons) Stop(ctx context.Context, gpu string) error {
	cmd, err := d.control(gpu, nil, "quit\n")
	if err != nil {
		return err
	}
	if _, err := d.Runner.Run(ctx, cmd); err != nil && d.Healthy(ctx, gpu) == nil {
		return fmt.Errorf("stopping MPS daemon of %s: %w", gpu, err)
	}
	if err := os.RemoveAll(filepath.Join(d.Dir, gpu)); err != nil {
		return fmt.Errorf("removing MPS directories of %s: %w", gpu, err)
	}
	return nil
}

func (d *Daemons) waitReady(ctx context.Context, gpu string) error {
	deadline := time.Now().Add(max(d.Ready, 100*time.Millisecond))
	var err error
	for time.Now().Before(deadline) {
		if err = d.Healthy(ctx, gpu); err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return errors.Join(err, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
	return fmt.Errorf("MPS daemon of %s not ready after %s: %w", gpu, d.Ready, err)
}

// Limits are one client's caps on a GPU.
type Limits struct {
	MemoryBytes      int64
	ThreadPercentage int
}

// ClientEnv is the environment a container needs to use the daemon with
// its limits; the memory limit names the GPU by UUID, which holds whatever
// the device ordinal inside the container.
func (d *Daemons) ClientEnv(gpu string, l Limits) map[string]string {
	return map[string]string{
		EnvPipeDir:        d.PipeDir(gpu),
		EnvPinnedMemLimit: fmt.Sprintf("%s=%dM", gpu, max(l.MemoryBytes>>20, 1)),
		EnvThreads:        fmt.Sprint(l.ThreadPercentage),
	}
}
