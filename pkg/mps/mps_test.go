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
	if !strings.Contains(env, "CUDA_VISIBLE_DEVICES="+gpu) || !strings.Contains(env, EnvPipeDir+"="+d.PipeDir(gpu)) ||
		!strings.Contains(env, "LD_LIBRARY_PATH="+filepath.Join(d.DriverRoot, "usr/lib/x86_64-linux-gnu")+":") {
		t.Errorf("daemon env %s", env)
	}
	if info, err := os.Stat(d.ShmDir(gpu)); err != nil || !info.IsDir() {
		t.Errorf("no shared-memory directory for the daemon and its clients: %v", err)
	}
	r.alive = false // the daemon died
	if err := d.Ensure(ctx, gpu); err != nil || !r.alive {
		t.Fatalf("not restarted: %v", err)
	}
	if err := d.Stop(ctx, gpu); err != nil || r.alive {
		t.Fatalf("stop: %v", err)
	}
	if _, err := os.Stat(filepath.Join(d.Dir, gpu)); !os.IsNotExist(err) {
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
