package prepare

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/gpuaas/gpu-dra-driver/pkg/mps"
	"github.com/gpuaas/gpu-dra-driver/pkg/timeslice"
)

// daemonRunner is a driver root whose MPS daemons live and die: -d starts
// the one of CUDA_VISIBLE_DEVICES, quit stops it, and the client fails
// when none runs, as nvidia-cuda-mps-control does.
type daemonRunner struct {
	mu     sync.Mutex
	alive  map[string]bool
	starts []string
	quits  []string
}

func (r *daemonRunner) Run(_ context.Context, c timeslice.Cmd) ([]byte, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var gpu string
	for _, kv := range c.Env {
		if v, ok := strings.CutPrefix(kv, "CUDA_VISIBLE_DEVICES="); ok {
			gpu = v
		}
	}
	switch {
	case filepath.Base(c.Path) != "nvidia-cuda-mps-control":
		return nil, nil
	case slices.Equal(c.Args, []string{"-d"}):
		r.alive[gpu] = true
		r.starts = append(r.starts, gpu)
	case !r.alive[gpu]:
		return nil, errors.New("Cannot find MPS control daemon process")
	case c.Stdin == "quit\n":
		r.alive[gpu] = false
		r.quits = append(r.quits, gpu)
	}
	return daemonAnswers(c.Stdin), nil
}

func withDaemons(t *testing.T, e *testEnv) *daemonRunner {
	t.Helper()
	withTools(t, e)
	r := &daemonRunner{alive: map[string]bool{}}
	e.Sharing.Runner = r
	e.state = e.newState(t)
	return r
}

func (e *testEnv) computeMode(t *testing.T, uuid string) nvml.ComputeMode {
	t.Helper()
	dev, err := e.Lib.DeviceByUUID(uuid)
	if err != nil {
		t.Fatal(err)
	}
	mode, ret := dev.GetComputeMode()
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	return mode
}

// TestRestoreRestartsMPSDaemonAndComputeMode: the daemon of a prepared MPS
// claim died while the plugin was down (it was the old plugin's child) and
// the GPU's compute mode was reset; the restarted plugin starts the daemon
// again and puts the mode back before it serves, so running clients and
// the next claim find them.
func TestRestoreRestartsMPSDaemonAndComputeMode(t *testing.T) {
	e := newTestEnvWith(t, "dgxh100", sharingNode())
	run := withDaemons(t, e)
	uuid := e.GPUUUID(7)
	claim := mpsShareClaim("a", "10Gi").Build()
	if _, err := e.state.Prepare(e.Ctx, claim); err != nil {
		t.Fatal(err)
	}
	run.alive[uuid] = false
	dev, _ := e.Lib.DeviceByUUID(uuid)
	if ret := dev.SetComputeMode(nvml.COMPUTEMODE_DEFAULT); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}

	restartWith(t, e, claim)
	if !run.alive[uuid] || len(run.starts) != 2 {
		t.Errorf("daemon not started again at restore: alive %v, starts %v", run.alive[uuid], run.starts)
	}
	if mode := e.computeMode(t, uuid); mode != nvml.COMPUTEMODE_EXCLUSIVE_PROCESS {
		t.Errorf("compute mode %v after restore, want exclusive-process", mode)
	}
}

// TestRestoreKeepsLiveMPSDaemon: a daemon that survived the restart (a
// pod of its own) is left alone: its clients keep their server.
func TestRestoreKeepsLiveMPSDaemon(t *testing.T) {
	e := newTestEnvWith(t, "dgxh100", sharingNode())
	run := withDaemons(t, e)
	claim := mpsShareClaim("a", "10Gi").Build()
	if _, err := e.state.Prepare(e.Ctx, claim); err != nil {
		t.Fatal(err)
	}
	restartWith(t, e, claim)
	if len(run.starts) != 1 || len(run.quits) != 0 {
		t.Errorf("restore touched a live daemon: starts %v quits %v", run.starts, run.quits)
	}
}

// TestRestoreStopsMPSDaemonNobodyHolds: a daemon with no claim (its prepare
// was killed after it started and before a record named it, or its
// reset failed) is stopped at restore, and its GPU's mode reset.
func TestRestoreStopsMPSDaemonNobodyHolds(t *testing.T) {
	e := newTestEnvWith(t, "dgxh100", sharingNode())
	run := withDaemons(t, e)
	uuid := e.GPUUUID(7)
	if err := e.state.env.Sharing.Apply(e.Ctx, uuid, timeslice.Settings{Strategy: "MPS"}); err != nil {
		t.Fatal(err)
	}
	restartWith(t, e)
	if run.alive[uuid] || !slices.Equal(run.quits, []string{uuid}) {
		t.Errorf("orphaned daemon not stopped: alive %v quits %v", run.alive[uuid], run.quits)
	}
	if _, err := os.Stat((&mps.Daemons{Dir: e.Sharing.MPSDir}).GPUDir(uuid)); !os.IsNotExist(err) {
		t.Errorf("its directory is left: %v", err)
	}
	if mode := e.computeMode(t, uuid); mode != nvml.COMPUTEMODE_DEFAULT {
		t.Errorf("compute mode %v with no MPS claim", mode)
	}
}
