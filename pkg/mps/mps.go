// Package mps runs one MPS control daemon per GPU for claims that share a
// GPU with enforced limits. The daemon runs outside the plugin's process
// (a Launcher decides where: a pod of its own on the node, or a background
// process), so that it survives plugin restarts and rolling updates; its
// pipe, log and shared-memory directories are host directories that the
// daemon and every client container mount (the clients through the CDI
// spec). The plugin talks to it only through nvidia-cuda-mps-control, with
// fixed arguments: health-checked before each new client, asked to quit
// when the GPU's last MPS claim is gone.
package mps

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
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

// ShmContainerPath is where the daemon and its clients see the GPU's
// shared memory: MPS clients and server exchange work through /dev/shm.
const ShmContainerPath = "/dev/shm"

// Daemons manages the control daemons of a node.
type Daemons struct {
	Runner     timeslice.Runner
	DriverRoot string
	// Dir holds one directory per GPU (pipe, log, shm).
	Dir string
	// Ready bounds the wait for a started daemon to answer.
	Ready time.Duration
	// Launcher runs the daemons; nil means ProcessLauncher.
	Launcher Launcher
	// Shm provides each GPU's shared memory directory; nil leaves it a
	// plain directory (daemons run as processes, which share none).
	Shm ShmMounter
}

// GPUDir is a GPU's directory. It is named by the first 12 hex digits of
// the UUID, not the whole UUID: the daemon's sockets live below it, and a
// Unix socket's path must fit in 108 bytes (with the whole UUID, a kubelet
// root a little longer than /var/lib/kubelet is already too long). The
// full UUID is in the directory's gpu file.
func (d *Daemons) GPUDir(gpu string) string {
	id := strings.ReplaceAll(strings.TrimPrefix(gpu, "GPU-"), "-", "")
	return filepath.Join(d.Dir, strings.ToLower(id[:min(len(id), 12)]))
}

// PipeDir is where the daemon of a GPU listens; clients need it mounted.
func (d *Daemons) PipeDir(gpu string) string { return filepath.Join(d.GPUDir(gpu), pipeSubdir) }

// ShmDir is the GPU's shared memory directory, mounted at /dev/shm in the
// daemon and its clients.
func (d *Daemons) ShmDir(gpu string) string { return filepath.Join(d.GPUDir(gpu), "shm") }

// LogDir is where the daemon writes control.log.
func (d *Daemons) LogDir(gpu string) string { return filepath.Join(d.GPUDir(gpu), logSubdir) }

// The subdirectories of a GPU's directory.
const (
	pipeSubdir = "pipe"
	logSubdir  = "log"
)

// uuidFile names the GPU of a directory.
const uuidFile = "gpu"

func (d *Daemons) launcher() Launcher {
	if d.Launcher == nil {
		return ProcessLauncher{Runner: d.Runner}
	}
	return d.Launcher
}

// control builds a control command for one GPU's daemon: the client when
// stdin is given, the daemon itself for a Launcher to start.
func (d *Daemons) control(gpu string, stdin string) (timeslice.Cmd, error) {
	if err := timeslice.ValidateUUID(gpu); err != nil {
		return timeslice.Cmd{}, err
	}
	bin, err := timeslice.FindBinary(d.DriverRoot, ControlBinary)
	if err != nil {
		return timeslice.Cmd{}, fmt.Errorf("MPS: %w", err)
	}
	// No library path: the control binary needs only libc, and the
	// image's own must not be mixed with the driver root's (a pod runs
	// the daemon inside the driver root instead).
	env := []string{"CUDA_VISIBLE_DEVICES=" + gpu, EnvPipeDir + "=" + d.PipeDir(gpu), EnvLogDir + "=" + d.LogDir(gpu)}
	return timeslice.Cmd{Path: bin, Env: env, Stdin: stdin}, nil
}

// Available reports whether daemons can be started here at all, so prepare
// fails before it changes anything.
func (d *Daemons) Available() error {
	if _, err := timeslice.FindBinary(d.DriverRoot, ControlBinary); err != nil {
		return fmt.Errorf("MPS: %w", err)
	}
	return nil
}

// DaemonOf is the daemon of a GPU as Start hands it to the Launcher. The
// chart's admission policy for daemon pods is tested with it
// (test/e2e/mpspolicy_test.go), so it must stay what Start launches.
func (d *Daemons) DaemonOf(gpu string) (Daemon, error) {
	cmd, err := d.control(gpu, "")
	if err != nil {
		return Daemon{}, err
	}
	return Daemon{GPU: gpu, Command: cmd, Dir: d.GPUDir(gpu), ShmDir: d.ShmDir(gpu)}, nil
}

// Start launches the daemon of a GPU and waits until it answers.
func (d *Daemons) Start(ctx context.Context, gpu string) error {
	daemon, err := d.DaemonOf(gpu)
	if err != nil {
		return err
	}
	for _, dir := range []string{d.PipeDir(gpu), d.LogDir(gpu), d.ShmDir(gpu)} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("MPS directory: %w", err)
		}
	}
	if err := os.WriteFile(filepath.Join(d.GPUDir(gpu), uuidFile), []byte(gpu+"\n"), 0o644); err != nil {
		return fmt.Errorf("MPS directory: %w", err)
	}
	if d.Shm != nil {
		if err := d.Shm.Mount(d.ShmDir(gpu)); err != nil {
			return err
		}
	}
	if err := d.launcher().Launch(ctx, daemon); err != nil {
		return err
	}
	return d.waitReady(ctx, gpu)
}

// Healthy asks the daemon a harmless question.
func (d *Daemons) Healthy(ctx context.Context, gpu string) error {
	cmd, err := d.control(gpu, "get_default_active_thread_percentage\n")
	if err != nil {
		return err
	}
	if _, err := d.Runner.Run(ctx, cmd); err != nil {
		return fmt.Errorf("MPS daemon of %s not answering: %w", gpu, err)
	}
	return nil
}

// Ensure starts a daemon that stopped answering (or was never started on
// this boot).
func (d *Daemons) Ensure(ctx context.Context, gpu string) error {
	if d.Healthy(ctx, gpu) == nil {
		return nil
	}
	return d.Start(ctx, gpu)
}

// Stop asks the daemon to quit, removes what the launcher made for it and
// its directories.
func (d *Daemons) Stop(ctx context.Context, gpu string) error {
	cmd, err := d.control(gpu, "quit\n")
	if err != nil {
		return err
	}
	if _, err := d.Runner.Run(ctx, cmd); err != nil && d.Healthy(ctx, gpu) == nil {
		return fmt.Errorf("stopping MPS daemon of %s: %w", gpu, err)
	}
	if err := d.launcher().Remove(ctx, gpu); err != nil {
		return fmt.Errorf("removing MPS daemon of %s: %w", gpu, err)
	}
	if d.Shm != nil {
		if err := d.Shm.Unmount(d.ShmDir(gpu)); err != nil {
			return err
		}
	}
	if err := os.RemoveAll(d.GPUDir(gpu)); err != nil {
		return fmt.Errorf("removing MPS directories of %s: %w", gpu, err)
	}
	return nil
}

// Known lists the GPUs that have daemon directories: those a daemon was
// started for and not stopped, so that one nobody holds can be stopped.
func (d *Daemons) Known() ([]string, error) {
	entries, err := os.ReadDir(d.Dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing MPS directories: %w", err)
	}
	var gpus []string
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(d.Dir, e.Name(), uuidFile))
		if !e.IsDir() || err != nil {
			continue // not started far enough to have launched anything
		}
		if gpu := strings.TrimSpace(string(data)); timeslice.ValidateUUID(gpu) == nil {
			gpus = append(gpus, gpu)
		}
	}
	return gpus, nil
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
		case <-time.After(100 * time.Millisecond):
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
