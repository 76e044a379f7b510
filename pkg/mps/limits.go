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
// GPU, so its defaults are the largest limits among them (Cover): a client
// that drops its variables gets at most the largest share on its GPU, never
// the whole GPU.

// Cover sets the GPU daemon's default limits to l when first is true (the
// daemon's only client so far), else raises them to cover l, and applies
// the result to the servers already running. It returns what is in force.
func (d *Daemons) Cover(ctx context.Context, gpu string, l Limits, first bool) (Limits, error) {
	want := l
	if !first {
		cur, err := d.Defaults(ctx, gpu)
		if err != nil {
			return Limits{}, err
		}
		want = Limits{MemoryBytes: max(cur.MemoryBytes, l.MemoryBytes), ThreadPercentage: max(cur.ThreadPercentage, l.ThreadPercentage)}
	}
	if _, err := d.send(ctx, gpu, setDefaults(want)); err != nil {
		return Limits{}, fmt.Errorf("setting the MPS limits of %s: %w", gpu, err)
	}
	servers, err := d.send(ctx, gpu, "get_server_list\n")
	if err != nil {
		return Limits{}, fmt.Errorf("listing the MPS servers of %s: %w", gpu, err)
	}
	if cmds := setServers(servers, want); cmds != "" {
		if _, err := d.send(ctx, gpu, cmds); err != nil {
			return Limits{}, fmt.Errorf("setting the MPS limits of the servers of %s: %w", gpu, err)
		}
	}
	return want, nil
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
