package mps

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpuaas/gpu-dra-driver/pkg/timeslice"
)

const gpu = "GPU-12345678-aaaa"

type runner struct {
	cmds  []timeslice.Cmd
	alive bool
}

func (r *runner) Run(_ context.Context, c timeslice.Cmd) ([]byte, error) {
	r.cmds = append(r.cmds, c)
	switch {
	case len(c.Args) == 1 && c.Args[0] == "-d":
		r.alive = true
	case c.Stdin == "quit\n":
		r.alive = false
	case !r.alive:
		return nil, errors.New("no daemon")
	}
	return nil, nil
}

func daemons(t *testing.T) (*Daemons, *runner) {
	root := t.TempDir()
	bin := filepath.Join(root, "usr", "bin", ControlBinary)
	_ = os.MkdirAll(filepath.Dir(bin), 0o755)
	_ = os.WriteFile(bin, nil, 0o755)
	r := &runner{}
	return &Daemons{Runner: r, DriverRoot: root, Dir: t.TempDir()}, r
}

func TestDaemonLifecycle(t *testing.T) {
	d, r := daemons(t)
	ctx := context.Background()
	if err := d.Start(ctx, gpu); err != nil {
		t.Fatal(err)
	}
	env := strings.Join(r.cmds[0].Env, " ")
	// No loader path: the driver root's libc must not be mixed with
	// this image's (the control binary needs libc only).
	if !strings.Contains(env, "CUDA_VISIBLE_DEVICES="+gpu) || !strings.Contains(env, EnvPipeDir+"="+d.PipeDir(gpu)) ||
		strings.Contains(env, "LD_") {
		t.Errorf("daemon env %s", env)
	}
	if info, err := os.Stat(d.ShmDir(gpu)); err != nil || !info.IsDir() {
		t.Errorf("no shared-memory directory for the daemon and its clients: %v", err)
	}
	if known, err := d.Known(); err != nil || len(known) != 1 || known[0] != gpu {
		t.Errorf("Known() = %v, %v; want the started GPU", known, err)
	}
	r.alive = false // the daemon died
	if err := d.Ensure(ctx, gpu); err != nil || !r.alive {
		t.Fatalf("not restarted: %v", err)
	}
	if err := d.Stop(ctx, gpu); err != nil || r.alive {
		t.Fatalf("stop: %v", err)
	}
	if _, err := os.Stat(d.GPUDir(gpu)); !os.IsNotExist(err) {
		t.Error("pipe directory left")
	}
}

func TestNoBinaryIsClear(t *testing.T) {
	d := &Daemons{Runner: &runner{}, DriverRoot: t.TempDir()}
	if err := d.Start(context.Background(), gpu); !errors.Is(err, timeslice.ErrNoBinary) || !strings.Contains(err.Error(), ControlBinary) {
		t.Errorf("err = %v", err)
	}
}

func TestClientEnv(t *testing.T) {
	d, _ := daemons(t)
	env := d.ClientEnv(gpu, Limits{MemoryBytes: 10 << 30, ThreadPercentage: 25})
	if env[EnvPinnedMemLimit] != gpu+"=10240M" || env[EnvThreads] != "25" || env[EnvPipeDir] != d.PipeDir(gpu) {
		t.Errorf("env = %v", env)
	}
}

// TestSocketPathsFitUnderLongKubeletRoots: the daemon's sockets live in the
// pipe directory; a Unix socket path must fit in 108 bytes. A kubelet root
// as long as the e2e node's once made bind fail with EINVAL.
func TestSocketPathsFitUnderLongKubeletRoots(t *testing.T) {
	d := &Daemons{Dir: "/tmp/gpuaas-e2e-3422150457/rn/1/kubelet/plugins/gpu.gpuaas.io/mps"}
	sock := filepath.Join(d.PipeDir("GPU-8c17a640-8185-5add-9806-b2eef3e16aa4"), "control_privileged")
	if len(sock) >= 108 {
		t.Errorf("socket path %s is %d bytes, over the 107 a Unix socket allows", sock, len(sock))
	}
}

// limitsRunner plays a live daemon's limits, as the real control daemon
// answers them (no memory limit prints nothing).
type limitsRunner struct {
	pct   string
	mem   string
	stdin []string
}

func (r *limitsRunner) Run(_ context.Context, c timeslice.Cmd) ([]byte, error) {
	r.stdin = append(r.stdin, c.Stdin)
	var out []string
	for _, line := range strings.Split(strings.TrimSpace(c.Stdin), "\n") {
		f := strings.Fields(line)
		switch f[0] {
		case "get_default_active_thread_percentage":
			out = append(out, r.pct)
		case "get_default_device_pinned_mem_limit":
			if r.mem != "" {
				out = append(out, r.mem)
			}
		case "set_default_active_thread_percentage":
			r.pct = f[1] + ".0"
		case "set_default_device_pinned_mem_limit":
			r.mem = f[2]
		case "get_server_list":
			out = append(out, "4242")
		}
	}
	return []byte(strings.Join(out, "\n")), nil
}

// The daemon's defaults, which a client cannot raise from its environment,
// are what the caller sets, and reach the servers already running.
func TestSetDefaultsSetsTheDaemonsLimits(t *testing.T) {
	d, _ := daemons(t)
	r := &limitsRunner{pct: "100.0"}
	d.Runner = r
	ctx := context.Background()
	ten := Limits{MemoryBytes: 10 << 30, ThreadPercentage: 13}
	if err := d.SetDefaults(ctx, gpu, ten); err != nil {
		t.Fatal(err)
	}
	if got, err := d.Defaults(ctx, gpu); err != nil || got != ten {
		t.Errorf("daemon defaults: %+v, %v (answers %q)", got, err, r.stdin)
	}
	if err := d.SetDefaults(ctx, gpu, Limits{MemoryBytes: 20 << 30, ThreadPercentage: 25}); err != nil {
		t.Fatal(err)
	}
	last := r.stdin[len(r.stdin)-1]
	if !strings.Contains(last, "set_active_thread_percentage 4242 25") || !strings.Contains(last, "set_device_pinned_mem_limit 4242 0 20480M") {
		t.Errorf("the running server did not get the limits: %q", r.stdin)
	}
}

func TestParseMemLimit(t *testing.T) {
	for in, want := range map[string]int64{"10G": 10 << 30, "512M": 512 << 20, "1.5G": 3 << 29, "": 0, "none": 0} {
		if got := ParseMemLimit(in); got != want {
			t.Errorf("ParseMemLimit(%q) = %d, want %d", in, got, want)
		}
	}
}
