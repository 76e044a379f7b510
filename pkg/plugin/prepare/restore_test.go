package prepare

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/telemetry"

	cdipkg "github.com/gpuaas/gpu-dra-driver/pkg/cdi"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/checkpoint"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
)

// These tests use the fake clientset on purpose: Restore only GETs and
// LISTs claims, and each case needs a precise set of claims in the API.
// The restart path against a real API server is covered in test/e2e.

func restartWith(t *testing.T, e *testEnv, apiClaims ...*resourceapi.ResourceClaim) *State {
	t.Helper()
	e.metrics = telemetry.NewMetrics(prometheus.NewRegistry())
	s := e.newState(t)
	restore(t, e, s, apiClaims...)
	return s
}

// restore runs s's Restore as Start does, with apiClaims in the API.
func restore(t *testing.T, e *testEnv, s *State, apiClaims ...*resourceapi.ResourceClaim) {
	objs := make([]runtime.Object, 0, len(apiClaims))
	for _, c := range apiClaims {
		objs = append(objs, c)
	}
	if err := s.Restore(e.ctx, fake.NewClientset(objs...)); err != nil {
		t.Error(err)
	}
}

func TestRestartKeepsPreparedClaims(t *testing.T) {
	e := newTestEnv(t, "dgxh100")
	claim := newClaim("live").device("gpu", "gpu-1").build()
	before, err := e.state.Prepare(e.ctx, claim)
	if err != nil {
		t.Fatal(err)
	}
	s := restartWith(t, e, claim)
	after, err := s.Prepare(e.ctx, claim)
	if err != nil || len(after) != 1 || after[0].CDIDeviceIDs[0] != before[0].CDIDeviceIDs[0] {
		t.Fatalf("after restart: %v, %v", after, err)
	}
	// The restarted plugin still knows gpu-1 is taken.
	if _, err := s.Prepare(e.ctx, newClaim("other").device("gpu", "gpu-1").build()); err == nil {
		t.Error("restarted plugin prepared gpu-1 for a second claim")
	}
	if err := s.Unprepare(e.ctx, "live"); err != nil || e.cdiSpecExists("live") || e.recordExists("live") {
		t.Errorf("unprepare after restart: %v", err)
	}
}

func TestRestartCleansClaimsDeletedWhileDown(t *testing.T) {
	e := newTestEnv(t, "dgxh100")
	gone := newClaim("gone").device("gpu", "gpu-1").build()
	replaced := newClaim("old").device("gpu", "gpu-2").build()
	kept := newClaim("kept").device("gpu", "gpu-3").build()
	for _, c := range []*resourceapi.ResourceClaim{gone, replaced, kept} {
		if _, err := e.state.Prepare(e.ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	// Same name as "old" but a new UID: the old claim was deleted.
	newer := newClaim("new").build()
	newer.Name = replaced.Name
	s := restartWith(t, e, kept, newer)
	for _, uid := range []string{"gone", "old"} {
		if e.cdiSpecExists(uid) || e.recordExists(uid) || s.index.get(typesUID(uid)) != nil {
			t.Errorf("stale claim %s not cleaned up", uid)
		}
	}
	if !e.cdiSpecExists("kept") || s.index.get("kept") == nil {
		t.Error("live claim lost")
	}
	if got := testutil.ToFloat64(e.metrics.StaleCleaned); got != 2 {
		t.Errorf("stale_claims_cleaned_total = %v, want 2", got)
	}
}

func TestRestartRebuildsDamagedRecord(t *testing.T) {
	e := newTestEnv(t, "dgxh100")
	live := newClaim("live").device("gpu", "gpu-4").build()
	dead := newClaim("dead").device("gpu", "gpu-5").build()
	for _, c := range []*resourceapi.ResourceClaim{live, dead} {
		if _, err := e.state.Prepare(e.ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	for _, uid := range []string{"live", "dead"} {
		if err := os.WriteFile(filepath.Join(e.ckptDir, uid+".json"), []byte(`{"version":"v1","checksum":"x"`), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	s := restartWith(t, e, live) // "dead" is gone from the API
	if got := testutil.ToFloat64(e.metrics.Damaged); got != 2 {
		t.Errorf("checkpoint_damaged_total = %v, want 2", got)
	}
	if s.index.get("live") == nil || !e.recordExists("live") || !e.cdiSpecExists("live") {
		t.Error("damaged record of a live claim not rebuilt")
	}
	if e.cdiSpecExists("dead") || s.index.get("dead") != nil {
		t.Error("damaged record of a deleted claim: CDI spec kept")
	}
	if _, err := os.Stat(filepath.Join(e.ckptDir, "dead.json.damaged")); err != nil {
		t.Errorf("damaged file not kept for inspection: %v", err)
	}
}

func TestRestartUndoesInterruptedPrepareAndOrphanSpecs(t *testing.T) {
	e := newTestEnv(t, "dgxh100")
	store, _ := checkpoint.NewStore(e.ckptDir)
	started := &checkpoint.Claim{UID: "half", Namespace: "team-a", Name: "claim-half", State: checkpoint.PrepareStarted,
		Devices: []checkpoint.Device{{Pool: testNode, Device: "gpu-6", GPUUUID: e.lib.GPUs()[6].UUID}}}
	if err := store.Save(started); err != nil {
		t.Fatal(err)
	}
	handler, _ := cdipkg.NewHandler(cdipkg.Options{CDIRoot: e.cdiRoot, NVML: e.lib.NVML()})
	for _, uid := range []string{"half", "orphan"} {
		if _, err := handler.WriteClaimSpec(uid, []cdipkg.Device{{Name: "gpu-6", UUID: "GPU-x", Minor: 6}}); err != nil {
			t.Fatal(err)
		}
	}
	s := restartWith(t, e, newClaim("half").build())
	for _, uid := range []string{"half", "orphan"} {
		if e.cdiSpecExists(uid) || e.recordExists(uid) {
			t.Errorf("%s: files left after restart", uid)
		}
	}
	if _, err := s.Prepare(e.ctx, newClaim("next").device("gpu", "gpu-6").build()); err != nil {
		t.Errorf("gpu-6 not free after undoing the interrupted prepare: %v", err)
	}
}
