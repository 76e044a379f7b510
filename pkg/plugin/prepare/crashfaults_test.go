package prepare

import (
	"errors"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/gpuaas/gpu-dra-driver/pkg/mig"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev/nvmock"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/prepare/preparetest"
	resourceapi "k8s.io/api/resource/v1"
)

// crashFaultCycles is how many claims the crash test with hardware faults
// prepares and unprepares.
const crashFaultCycles = 120

// Issue 25 (Must show): the crash test with real hardware's behaviour on.
// The dynamic-MIG GPUs (1 and 2) are re-bound with a new minor number at
// every MIG mode switch, their switches are refused as in use a few times
// at random or left pending a reset (a claim error; the admin lifts the
// cause and the kubelet retries), MIG instance creation is slow, and at
// the end GPU 2 falls off the bus with claims on it, which the kubelet
// then unprepares. Every prepared claim's CDI spec names its GPU's
// /dev/nvidiaN as NVML numbers it then; and after the admin's reset brings
// GPU 2 back, nothing leaks, nor is any MIG mode left pending a reset.
func TestCrashPreparesLeakNothingWithHardwareFaults(t *testing.T) {
	start := time.Now()
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("CRASH_TEST_SEED"); v != "" {
		var err error
		if seed, err = strconv.ParseUint(v, 10, 64); err != nil {
			t.Fatalf("CRASH_TEST_SEED: %v", err)
		}
	}
	t.Logf("crash test seed %d (CRASH_TEST_SEED replays it)", seed)
	h := newCrashHarness(t, rand.New(rand.NewPCG(seed, 0)))
	// Whole GPUs offered in dynamic mode switch MIG off, partitions on:
	// both kinds make the GPUs switch MIG mode back and forth.
	h.extraKinds = []string{"dynamic whole", "dynamic whole"}
	dir := h.e.MockStateDir
	must(t, nvmock.SetCreateDelay(dir, 2*time.Millisecond))
	for _, gpu := range []string{"1", "2"} {
		must(t, nvmock.SetRebindOnMigMode(dir, gpu, true))
	}
	// The holders let go within a few refusals: the prepare's wait outlasts them.
	h.tune = func(s *State) { s.env.InUseRetry = mig.InUseRetry{Within: 20 * time.Second, First: time.Millisecond} }
	h.tune(h.state)
	var pendingFailures, inUseInjected, pendingInjected int
	h.retryable = func(err error) bool {
		if !errors.Is(err, mig.ErrPendingReset) {
			return false
		}
		pendingFailures++
		for _, gpu := range []string{"1", "2"} {
			must(t, nvmock.SetMigModePending(dir, gpu, false))
		}
		return true
	}
	h.prepared = func(claim *resourceapi.ResourceClaim) { checkSpecMinors(t, h.e, string(claim.UID)) }

	for h.stats.cycles < crashFaultCycles {
		gpu := strconv.Itoa(1 + h.rng.IntN(2))
		switch h.rng.IntN(6) {
		case 0:
			inUseInjected++
			must(t, nvmock.SetMigModeInUse(dir, gpu, 1+h.rng.IntN(3)))
		case 1:
			pendingInjected++
			must(t, nvmock.SetMigModePending(dir, gpu, true))
		}
		h.step()
	}
	// GPU 2 falls off the bus; the kubelet unprepares every claim (those on
	// GPU 2 once its pods are gone), the plugin still killed at random.
	must(t, nvmock.SetGPULost(dir, "2", true))
	for uid := range h.live {
		h.kubeletUnprepare(uid)
	}
	h.countdown = 0
	// The admin's reset brings it back, without the MIG devices it had.
	must(t, nvmock.SetGPULost(dir, "2", false))
	must(t, nvmock.ResetGPU(dir, "2"))
	h.restart()
	leaks := h.leaks()
	t.Logf("crash test with hardware faults: %d cycles (%v prepared by kind), %d kills at %d fault points, %d restarts; "+
		"injected %d in-use runs and %d pending switches, %d prepares failed pending a reset; leaks: %s; %s",
		h.stats.cycles, h.stats.prepared, h.stats.kills, h.stats.points, h.stats.restarts,
		inUseInjected, pendingInjected, pendingFailures, leaks, time.Since(start).Round(time.Millisecond))
	if leaks.total() != 0 {
		t.Errorf("leaks: %s", leaks)
	}
	for _, i := range []int{1, 2} {
		if cur, pend, ret := h.mockGPUDevice(i).GetMigMode(); ret != nvml.SUCCESS || cur != pend {
			t.Errorf("GPU %d left with MIG mode %d pending %d (%v): its next reset would switch it", i, cur, pend, ret)
		}
	}
	if h.stats.kills < crashFaultCycles/4 {
		t.Errorf("only %d kills in %d cycles", h.stats.kills, h.stats.cycles)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// checkSpecMinors checks that each device of a prepared claim's CDI spec
// names its GPU's /dev/nvidiaN by the minor number NVML answers now.
func checkSpecMinors(t *testing.T, e *testEnv, uid string) {
	t.Helper()
	rec := e.record(t, uid)
	spec := preparetest.ReadClaimSpec(t, e.Env, uid)
	for _, d := range rec.Devices {
		dev, ret := e.Lib.NVML().DeviceGetHandleByUUID(d.GPUUUID)
		if ret != nvml.SUCCESS {
			t.Fatalf("GPU %s of %s: %v", d.GPUUUID, d.Device, ret)
		}
		want, ret := dev.GetMinorNumber()
		if ret != nvml.SUCCESS {
			t.Fatal(ret)
		}
		_, name, _ := strings.Cut(d.CDIDeviceIDs[0], "=")
		found := false
		for _, sd := range spec.Devices {
			if sd.Name != name {
				continue
			}
			found = true
			for _, n := range sd.ContainerEdits.DeviceNodes {
				if m := preparetest.GPUNodePath.FindStringSubmatch(n.Path); m != nil && m[1] != strconv.Itoa(want) {
					t.Errorf("claim %s device %s: the CDI spec names %s, the GPU is /dev/nvidia%d", uid, d.Device, n.Path, want)
				}
			}
		}
		if !found {
			t.Errorf("claim %s: no CDI device %s in its spec", uid, name)
		}
	}
}
