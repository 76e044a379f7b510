package nvdev_test

import (
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev/nvmock"
)

// TestOneBadGPUDoesNotHideTheOthers: a GPU that fell off the bus before
// the plugin started, and one of a generation newer than go-nvlib, used to
// fail enumeration, so the plugin exited and published nothing (issue 25
// item 1). Now the lost GPU is left out and reported, the new one is kept
// with its brand and architecture Unknown, and the other six are read.
func TestOneBadGPUDoesNotHideTheOthers(t *testing.T) {
	dir := t.TempDir()
	first := openOn(t, "dgxh100", dir)
	lostUUID, newUUID := first.GPUs()[3].UUID, first.GPUs()[5].UUID
	_ = first.Shutdown()
	if err := nvmock.SetGPULost(dir, "3", true); err != nil {
		t.Fatal(err)
	}
	if err := nvmock.SetUnknownGeneration(dir, "5", true); err != nil {
		t.Fatal(err)
	}

	lib := openOn(t, "dgxh100", dir)
	defer func() { _ = lib.Shutdown() }()
	var uuids []string
	for _, g := range lib.GPUs() {
		uuids = append(uuids, g.UUID)
		if g.UUID == lostUUID {
			t.Errorf("the lost GPU is among the GPUs: %+v", g)
		}
		if g.UUID == newUUID && (g.Architecture != "Unknown" || g.Brand != "Unknown") {
			t.Errorf("GPU of an unknown generation reads brand %q, architecture %q; want Unknown", g.Brand, g.Architecture)
		}
		if g.UUID != newUUID && g.Architecture != "Hopper" {
			t.Errorf("GPU %d reads architecture %q, want Hopper", g.Index, g.Architecture)
		}
	}
	if len(uuids) != 7 {
		t.Fatalf("%d GPUs read, want 7 (all but the lost one): %v", len(uuids), uuids)
	}
	problems := lib.Problems()
	if len(problems) != 2 {
		t.Fatalf("problems %v, want the lost GPU and the unknown generation", problems)
	}
	lost, unknown := problems[0], problems[1]
	if lost.Index != 3 || !lost.Lost || lost.Published || lost.Reason() != "gpu-lost" ||
		!strings.Contains(lost.Err.Error(), nvml.ErrorString(nvml.ERROR_GPU_IS_LOST)) {
		t.Errorf("lost GPU reported as %+v (%s)", lost, lost.Reason())
	}
	if unknown.Index != 5 || unknown.UUID != newUUID || !unknown.Published || unknown.Lost ||
		!strings.Contains(unknown.Err.Error(), "architecture 99") {
		t.Errorf("GPU of an unknown generation reported as %+v", unknown)
	}

	// Recovered (re-attached), it is read again by the next session.
	_ = lib.Shutdown()
	if err := nvmock.ClearFaults(dir); err != nil {
		t.Fatal(err)
	}
	again := openOn(t, "dgxh100", dir)
	defer func() { _ = again.Shutdown() }()
	if n, p := len(again.GPUs()), again.Problems(); n != 8 || len(p) != 0 {
		t.Errorf("after recovery: %d GPUs, problems %v; want 8 and none", n, p)
	}
}

// TestLostGPUAnswersNoNewHandle: NVML hands out no new handle of a GPU
// that fell off the bus, by index or by UUID, as on a real node.
func TestLostGPUAnswersNoNewHandle(t *testing.T) {
	dir := t.TempDir()
	lib := openOn(t, "dgxa100", dir)
	defer func() { _ = lib.Shutdown() }()
	uuid := lib.GPUs()[2].UUID
	if err := nvmock.SetGPULost(dir, "2", true); err != nil {
		t.Fatal(err)
	}
	if _, ret := lib.NVML().DeviceGetHandleByIndex(2); ret != nvml.ERROR_GPU_IS_LOST {
		t.Errorf("handle by index of a lost GPU: %v, want GPU_IS_LOST", ret)
	}
	if _, ret := lib.NVML().DeviceGetHandleByUUID(uuid); ret != nvml.ERROR_GPU_IS_LOST {
		t.Errorf("handle by UUID of a lost GPU: %v, want GPU_IS_LOST", ret)
	}
	if _, ret := lib.NVML().DeviceGetHandleByIndex(1); ret != nvml.SUCCESS {
		t.Errorf("handle of a healthy GPU: %v", ret)
	}
}

// openOn opens a mock machine kept in dir, as one plugin process does. Not
// shutting it down is how a test kills that process.
func openOn(t *testing.T, machine, dir string) nvdev.Interface {
	t.Helper()
	lib, err := nvdev.Open(nvdev.Options{Backend: "mock:" + machine, MockSeed: "node-a", MockStateDir: dir})
	if err != nil {
		t.Fatalf("opening %s on %s: %v", machine, dir, err)
	}
	return lib
}
