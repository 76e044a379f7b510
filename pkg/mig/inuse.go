package mig

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// A MIG mode change is refused (ERROR_IN_USE) while another process holds
// the GPU: dcgm-exporter, nvidia-smi, an MPS daemon, the other plugin pod
// of a rolling update while it reads the GPU. Most hold it briefly, so the
// change is retried for a while; one that holds it longer gets the claim a
// clear error naming it, where NVML can.

// InUseError is a MIG mode change refused because another process holds
// the GPU.
type InUseError struct {
	GPU  string
	Mode string
	// Processes are those NVML lists on the GPU; none when it lists none
	// (a process that opened the GPU without running CUDA work on it).
	Processes []Process
	// Tries and Waited say how long RetryInUse waited; zero without it.
	Tries  int
	Waited time.Duration
}

// Process is a process NVML lists on a GPU.
type Process struct {
	PID uint32
	// Name is what NVML names it; empty if it cannot (the process is in
	// another PID namespace than the plugin).
	Name string
}

func (e *InUseError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "MIG mode of GPU %s not set to %s: another process holds the GPU (NVML: %s)", e.GPU, e.Mode, nvml.ERROR_IN_USE)
	if e.Tries > 0 {
		fmt.Fprintf(&b, " through %d tries over %s", e.Tries, e.Waited.Round(time.Millisecond))
	}
	if len(e.Processes) == 0 {
		b.WriteString("; NVML lists no process on it: a monitoring agent (dcgm-exporter, nvidia-smi), an MPS control daemon or the other plugin pod of a rolling update may hold it")
		return b.String()
	}
	b.WriteString("; processes on it:")
	for _, p := range e.Processes {
		fmt.Fprintf(&b, " pid %d", p.PID)
		if p.Name != "" {
			fmt.Fprintf(&b, " (%s)", p.Name)
		}
	}
	return b.String()
}

// Unwrap lets errors.Is(err, nvml.ERROR_IN_USE) find it.
func (e *InUseError) Unwrap() error { return nvml.ERROR_IN_USE }

// InUseRetry is how a MIG mode change waits for a GPU another process
// holds.
type InUseRetry struct {
	// Within bounds the whole wait; it must stay well inside the
	// kubelet's DRA call timeout, since the claim's prepare waits on it.
	Within time.Duration
	// First is the first pause, doubled after each refusal up to
	// maxInUsePause.
	First time.Duration
	// ProcessName names a process NVML lists on the GPU
	// (nvml.Interface.SystemGetProcessName); nil names none.
	ProcessName func(pid int) (string, nvml.Return)
}

// DefaultInUseRetry waits up to 10 s: a monitoring agent's poll of the GPU
// is over well within that, and the kubelet's 45 s DRA call has room left
// for the MIG device's creation and the rest of the prepare.
var DefaultInUseRetry = InUseRetry{Within: 10 * time.Second, First: 250 * time.Millisecond}

const maxInUsePause = 2 * time.Second

// RetryInUse runs change (EnableMigMode or DisableMigMode) on dev, again
// while the GPU refuses it as in use, for at most r.Within or until ctx
// ends. The last refusal comes back as an *InUseError naming what NVML
// sees on the GPU; any other outcome of change comes back as it is.
func RetryInUse(ctx context.Context, dev nvml.Device, r InUseRetry, change func(nvml.Device) error) error {
	start := time.Now()
	pause := r.First
	for tries := 1; ; tries++ {
		err := change(dev)
		// Only a refusal that changed nothing comes back as an InUseError
		// (apply): a change left half-done is never retried.
		var inUse *InUseError
		if !errors.As(err, &inUse) {
			return err
		}
		inUse.Tries, inUse.Waited = tries, time.Since(start)
		if time.Since(start)+pause > r.Within {
			inUse.Processes = processesOn(dev, r.ProcessName)
			return inUse
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			inUse.Processes = processesOn(dev, r.ProcessName)
			return errors.Join(inUse, context.Cause(ctx))
		case <-t.C:
		}
		pause = min(2*pause, maxInUsePause)
	}
}

// processesOn lists the compute processes NVML sees on a GPU (an MPS
// server among them); none if NVML cannot tell.
func processesOn(dev nvml.Device, name func(int) (string, nvml.Return)) []Process {
	infos, ret := dev.GetComputeRunningProcesses()
	if ret != nvml.SUCCESS {
		return nil
	}
	out := make([]Process, 0, len(infos))
	for _, info := range infos {
		p := Process{PID: info.Pid}
		if name != nil {
			if n, ret := name(int(info.Pid)); ret == nvml.SUCCESS {
				p.Name = n
			}
		}
		out = append(out, p)
	}
	return out
}
