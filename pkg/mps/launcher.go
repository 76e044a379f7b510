package mps

import (
	"context"
	"fmt"

	"github.com/gpuaas/gpu-dra-driver/pkg/timeslice"
)

// Daemon is one GPU's control daemon as a Launcher runs it: the control
// binary in the foreground or background, its environment, and the
// directory it shares with its clients.
type Daemon struct {
	GPU string
	// Command is nvidia-cuda-mps-control with the daemon's environment
	// (CUDA_VISIBLE_DEVICES, pipe and log directories, driver libraries),
	// as this process sees the driver root; Args are left to the Launcher.
	Command timeslice.Cmd
	// Dir is the GPU's directory: pipe, log and shm below it. It is a host
	// path, and the same path inside the plugin's container.
	Dir string
	// ShmDir is the GPU's shared memory, /dev/shm of the daemon and of
	// every client.
	ShmDir string
}

// Launcher runs control daemons somewhere that outlives this process.
// Launch is idempotent: a daemon that exists (even one still starting) is
// left alone; Daemons waits for it to answer. Remove is called after the
// daemon was asked to quit, and makes sure nothing of it is left.
type Launcher interface {
	Launch(ctx context.Context, d Daemon) error
	Remove(ctx context.Context, gpu string) error
}

// ProcessLauncher starts the daemon with -d, as a background process of
// this one's session. It lives as long as the plugin's container, no
// longer: right where the plugin runs as a host process (a simulated node,
// a systemd unit), not in the chart's pod, where PodLauncher is used.
type ProcessLauncher struct {
	Runner timeslice.Runner
}

// Launch implements Launcher.
func (p ProcessLauncher) Launch(ctx context.Context, d Daemon) error {
	cmd := d.Command
	cmd.Args = []string{"-d"}
	if _, err := p.Runner.Run(ctx, cmd); err != nil {
		return fmt.Errorf("starting MPS daemon of %s: %w", d.GPU, err)
	}
	return nil
}

// Remove implements Launcher: a quit daemon process is gone.
func (ProcessLauncher) Remove(context.Context, string) error { return nil }
