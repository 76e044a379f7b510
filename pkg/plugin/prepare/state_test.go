package prepare

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"

	cdipkg "github.com/gpuaas/gpu-dra-driver/pkg/cdi"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/prepare/preparetest"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"tags.cncf.io/container-device-interface/pkg/cdi"
)

func TestPrepareUnprepareRoundTrip(t *testing.T) {
	for _, machine := range []string{"dgxa100", "dgxh100"} {
		t.Run(machine, func(t *testing.T) {
			e := newTestEnv(t, machine)
			claim := preparetest.NewClaim("uid-1").Device("gpus", "gpu-2").Device("gpus", "gpu-5").Build()
			devs, err := e.state.Prepare(e.Ctx, claim)
			if err != nil {
				t.Fatalf("Prepare: %v", err)
			}
			if len(devs) != 2 || devs[0].DeviceName != "gpu-2" || devs[1].DeviceName != "gpu-5" {
				t.Fatalf("devices = %+v", devs)
			}
			for _, d := range devs {
				want := "k8s.gpu.gpuaas.io/claim=uid-1-" + d.DeviceName
				if len(d.CDIDeviceIDs) != 1 || d.CDIDeviceIDs[0] != want || d.PoolName != testNode || d.Requests[0] != "gpus" {
					t.Errorf("device %+v, want CDI ID %s", d, want)
				}
			}
			checkSpecParses(t, e, "uid-1", devs[0].CDIDeviceIDs[0], devs[1].CDIDeviceIDs[0])
			if !e.RecordExists("uid-1") {
				t.Error("no checkpoint record after prepare")
			}
			if err := e.state.Unprepare(e.Ctx, "uid-1"); err != nil {
				t.Fatalf("Unprepare: %v", err)
			}
			if e.CDISpecExists("uid-1") || e.RecordExists("uid-1") {
				t.Error("CDI spec or checkpoint record left after unprepare")
			}
		})
	}
}

// checkSpecParses reads the spec back with the CDI library's own cache,
// which validates it, and resolves the returned device IDs.
func checkSpecParses(t *testing.T, e *testEnv, uid string, ids ...string) {
	t.Helper()
	cache, err := cdi.NewCache(cdi.WithSpecDirs(e.CDIRoot), cdi.WithAutoRefresh(false))
	if err != nil {
		t.Fatalf("CDI cache: %v", err)
	}
	if errs := cache.GetErrors(); len(errs) > 0 {
		t.Fatalf("CDI spec errors: %v", errs)
	}
	for _, id := range ids {
		if cache.GetDevice(id) == nil {
			t.Errorf("CDI device %s not found in %s", id, e.CDIRoot)
		}
	}
	data, _ := os.ReadFile(cdipkg.SpecPath(e.CDIRoot, uid))
	// A whole GPU is named by its UUID; no other GPU's UUID may appear.
	for _, g := range e.Lib.GPUs() {
		whole := slices.ContainsFunc(ids, func(id string) bool { return strings.HasSuffix(id, fmt.Sprintf("-gpu-%d", g.Index)) })
		if strings.Contains(string(data), g.UUID) != whole {
			t.Errorf("spec mentions GPU %s wrongly: %s", g.UUID, data)
		}
	}
}

func TestPrepareAndUnprepareAreIdempotent(t *testing.T) {
	e := newTestEnv(t, "dgxh100")
	claim := preparetest.NewClaim("uid-1").Device("gpu", "gpu-0").Build()
	first, err := e.state.Prepare(e.Ctx, claim)
	if err != nil {
		t.Fatal(err)
	}
	second, err := e.state.Prepare(e.Ctx, claim)
	if err != nil {
		t.Fatalf("second Prepare: %v", err)
	}
	if fmt.Sprint(first) != fmt.Sprint(second) {
		t.Errorf("second Prepare = %v, want %v", second, first)
	}
	for i := range 2 {
		if err := e.state.Unprepare(e.Ctx, "uid-1"); err != nil {
			t.Fatalf("Unprepare #%d: %v", i+1, err)
		}
	}
	if err := e.state.Unprepare(e.Ctx, "never-prepared"); err != nil {
		t.Errorf("Unprepare of an unknown claim: %v", err)
	}
}

func TestOneDeviceIsNeverPreparedForTwoClaims(t *testing.T) {
	e := newTestEnv(t, "dgxh100")
	if _, err := e.state.Prepare(e.Ctx, preparetest.NewClaim("a").Device("gpu", "gpu-3").Build()); err != nil {
		t.Fatal(err)
	}
	_, err := e.state.Prepare(e.Ctx, preparetest.NewClaim("b").Device("gpu", "gpu-3").Build())
	if err == nil || !strings.Contains(err.Error(), "gpu-3 is already prepared for claim team-a/claim-a (a)") {
		t.Fatalf("second claim on gpu-3: err = %v", err)
	}
	if e.CDISpecExists("b") || e.RecordExists("b") {
		t.Error("refused claim left files behind")
	}
	// Admin access (monitoring) may share the device.
	if _, err := e.state.Prepare(e.Ctx, preparetest.NewClaim("mon").AdminDevice("gpu", "gpu-3").Build()); err != nil {
		t.Errorf("admin-access claim refused: %v", err)
	}
	// Once released, another claim may have it.
	if err := e.state.Unprepare(e.Ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.state.Prepare(e.Ctx, preparetest.NewClaim("b").Device("gpu", "gpu-3").Build()); err != nil {
		t.Errorf("claim after release: %v", err)
	}
}

func TestPrepareErrors(t *testing.T) {
	const ok = `{"apiVersion":"gpu.gpuaas.io/v1alpha1","kind":"GpuConfig"}`
	tests := []struct {
		name    string
		claim   *resourceapi.ResourceClaim
		wantErr string
	}{
		{"unknown field in claim config",
			preparetest.NewClaim("x").Device("gpu", "gpu-0").Config(resourceapi.AllocationConfigSourceClaim,
				`{"apiVersion":"gpu.gpuaas.io/v1alpha1","kind":"GpuConfig","sharing":{"strategy":"Exclusive","timeSlice":1}}`).Build(),
			`unknown field "sharing.timeSlice"`},
		{"unknown kind in class config",
			preparetest.NewClaim("x").Device("gpu", "gpu-0").Config(resourceapi.AllocationConfigSourceClass,
				`{"apiVersion":"gpu.gpuaas.io/v1alpha1","kind":"FpgaConfig"}`).Build(),
			`FpgaConfig`},
		{"MigConfig aimed at a whole GPU",
			preparetest.NewClaim("x").Device("gpu", "gpu-0").Config(resourceapi.AllocationConfigSourceClaim,
				`{"apiVersion":"gpu.gpuaas.io/v1alpha1","kind":"MigConfig"}`, "gpu").Build(),
			`a MigConfig cannot configure a device of type "gpu"`},
		{"device not on this node",
			preparetest.NewClaim("x").Device("gpu", "gpu-9").Config(resourceapi.AllocationConfigSourceClaim, ok).Build(),
			`device "gpu-9" is not published by this node`},
		{"other pool",
			preparetest.NewClaim("x").Result(resourceapi.DeviceRequestAllocationResult{Request: "gpu", Driver: "gpu.gpuaas.io", Pool: "node-b", Device: "gpu-0"}).Build(),
			`not this node's`},
		{"not allocated", &resourceapi.ResourceClaim{}, "is not allocated"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newTestEnv(t, "dgxh100")
			_, err := e.state.Prepare(e.Ctx, tc.claim)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("Prepare error = %v, want it to contain %q", err, tc.wantErr)
			}
			if e.CDISpecExists("x") || e.RecordExists("x") {
				t.Error("failed prepare left files behind")
			}
			// The device is free again: the failure reserved nothing.
			if _, err := e.state.Prepare(e.Ctx, preparetest.NewClaim("y").Device("gpu", "gpu-0").Build()); err != nil {
				t.Errorf("device not released after failure: %v", err)
			}
		})
	}
}

func TestConcurrentPreparesOnSharedGPUs(t *testing.T) {
	// Claims spanning overlapping GPU sets, prepared and unprepared at once:
	// the sorted per-GPU locks must neither deadlock nor double-book.
	e := newTestEnv(t, "dgxh100")
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			uid := fmt.Sprintf("c-%d", i)
			claim := preparetest.NewClaim(uid).AdminDevice("a", fmt.Sprintf("gpu-%d", i%8)).AdminDevice("b", fmt.Sprintf("gpu-%d", (i+3)%8)).Build()
			if _, err := e.state.Prepare(e.Ctx, claim); err != nil {
				t.Errorf("Prepare %s: %v", uid, err)
				return
			}
			if err := e.state.Unprepare(e.Ctx, types.UID(uid)); err != nil {
				t.Errorf("Unprepare %s: %v", uid, err)
			}
		}()
	}
	wg.Wait()
	if claims, devices := e.state.index.counts(); claims != 0 || devices != 0 {
		t.Errorf("left %d claims, %d devices", claims, devices)
	}
}
