package mps

import (
	"context"
	"fmt"
	"strconv"
	"strings"
)

// The daemon's defaults bind every MPS server it starts, and so every
// client whatever its environment: a client's CUDA_MPS_* variables can only
// lower its limits below them. One daemon serves all the MPS claims of a
// GPU, so its defaults are the caller's: what the node configuration sells
// on the GPU (device.daemonDefaults), never what a claim asks for.

// SetDefaults sets the GPU daemon's default limits to l and applies them
// to the servers already running.
func (d *Daemons) SetDefaults(ctx context.Context, gpu string, l Limits) error {
	if _, err := d.send(ctx, gpu, setDefaults(l)); err != nil {
		return fmt.Errorf("setting the MPS limits of %s: %w", gpu, err)
	}
	servers, err := d.send(ctx, gpu, "get_server_list\n")
	if err != nil {
		return fmt.Errorf("listing the MPS servers of %s: %w", gpu, err)
	}
	if cmds := setServers(servers, l); cmds != "" {
		if _, err := d.send(ctx, gpu, cmds); err != nil {
			return fmt.Errorf("setting the MPS limits of the servers of %s: %w", gpu, err)
		}
	}
	return nil
}

// Defaults reads the GPU daemon's default limits; an unset memory limit
// reads as 0 (none).
func (d *Daemons) Defaults(ctx context.Context, gpu string) (Limits, error) {
	out, err := d.send(ctx, gpu, "get_default_active_thread_percentage\nget_default_device_pinned_mem_limit 0\n")
	if err != nil {
		return Limits{}, fmt.Errorf("reading the MPS limits of %s: %w", gpu, err)
	}
	fields := strings.Fields(string(out))
	if len(fields) == 0 {
		return Limits{}, fmt.Errorf("reading the MPS limits of %s: no answer", gpu)
	}
	pct, err := strconv.ParseFloat(fields[0], 64)
	if err != nil {
		return Limits{}, fmt.Errorf("reading the MPS limits of %s: thread percentage %q: %w", gpu, fields[0], err)
	}
	l := Limits{ThreadPercentage: int(pct + 0.5)}
	if len(fields) > 1 {
		l.MemoryBytes = ParseMemLimit(fields[1])
	}
	return l, nil
}

// ParseMemLimit reads a pinned memory limit as the control daemon prints
// it ("10G", "512M"); anything else (no limit set) is 0.
func ParseMemLimit(s string) int64 {
	units := map[byte]int64{'K': 1 << 10, 'M': 1 << 20, 'G': 1 << 30, 'T': 1 << 40}
	if s == "" {
		return 0
	}
	unit, ok := units[s[len(s)-1]]
	if !ok {
		return 0
	}
	n, err := strconv.ParseFloat(s[:len(s)-1], 64)
	if err != nil {
		return 0
	}
	return int64(n * float64(unit))
}

// send runs the control client with commands on stdin.
func (d *Daemons) send(ctx context.Context, gpu, commands string) ([]byte, error) {
	cmd, err := d.control(gpu, commands)
	if err != nil {
		return nil, err
	}
	return d.Runner.Run(ctx, cmd)
}

// memLimit renders a limit for the control daemon, in MiB (device 0: the
// daemon sees only its GPU).
func memLimit(l Limits) string { return fmt.Sprintf("%dM", max(l.MemoryBytes>>20, 1)) }

func setDefaults(l Limits) string {
	return fmt.Sprintf("set_default_active_thread_percentage %d\nset_default_device_pinned_mem_limit 0 %s\n", l.ThreadPercentage, memLimit(l))
}

// setServers sets l on each running server listed (one PID per line;
// other lines are skipped).
func setServers(list []byte, l Limits) string {
	var b strings.Builder
	for _, pid := range strings.Fields(string(list)) {
		if _, err := strconv.Atoi(pid); err != nil {
			continue
		}
		fmt.Fprintf(&b, "set_active_thread_percentage %s %d\nset_device_pinned_mem_limit %s 0 %s\n", pid, l.ThreadPercentage, pid, memLimit(l))
	}
	return b.String()
}
