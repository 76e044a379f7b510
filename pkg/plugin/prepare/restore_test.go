package prepare

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	cdipkg "github.com/gpuaas/gpu-dra-driver/pkg/cdi"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/checkpoint"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/prepare/preparetest"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/telemetry"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// These tests use the fake clientset on purpose: Restore only GETs and
// LISTs claims, and each case needs a precise set of claims in the API.
// The restart path against a real API server is covered in test/e2e.

func restartWith(t *testing.T, e *testEnv, apiClaims ...*resourceapi.ResourceClaim) *State {
	t.Helper()
	return preparetest.RestartWith(t, e.Env, e.newState, apiClaims...)
}

func TestRestartKeepsPreparedClaims(t *testing.T) {
	e := newTestEnv(t, "dgxh100")
	claim := preparetest.NewClaim("live").Device("gpu", "gpu-1").Build()
	before, err := e.state.Prepare(e.Ctx, claim)
	if err != nil {
		t.Fatal(err)
	}
	s := restartWith(t, e, claim)
	after, err := s.Prepare(e.Ctx, claim)
	if err != nil || len(after) != 1 || after[0].CDIDeviceIDs[0] != before[0].CDIDeviceIDs[0] {
		t.Fatalf("after restart: %v, %v", after, err)
	}
	// The restarted plugin still knows gpu-1 is taken.
	if _, err := s.Prepare(e.Ctx, preparetest.NewClaim("other").Device("gpu", "gpu-1").Build()); err == nil {
		t.Error("restarted plugin prepared gpu-1 for a second claim")
	}
	if err := s.Unprepare(e.Ctx, "live"); err != nil || e.CDISpecExists("live") || e.RecordExists("live") {
		t.Errorf("unprepare after restart: %v", err)
	}
}

func TestRestartCleansClaimsDeletedWhileDown(t *testing.T) {
	e := newTestEnv(t, "dgxh100")
	gone := preparetest.NewClaim("gone").Device("gpu", "gpu-1").Build()
	replaced := preparetest.NewClaim("old").Device("gpu", "gpu-2").Build()
	kept := preparetest.NewClaim("kept").Device("gpu", "gpu-3").Build()
	for _, c := range []*resourceapi.ResourceClaim{gone, replaced, kept} {
		if _, err := e.state.Prepare(e.Ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	// Same name as "old" but a new UID: the old claim was deleted.
	newer := preparetest.NewClaim("new").Build()
	newer.Name = replaced.Name
	s := restartWith(t, e, kept, newer)
	for _, uid := range []string{"gone", "old"} {
		if e.CDISpecExists(uid) || e.RecordExists(uid) || s.index.get(typesUID(uid)) != nil {
			t.Errorf("stale claim %s not cleaned up", uid)
		}
	}
	if !e.CDISpecExists("kept") || s.index.get("kept") == nil {
		t.Error("live claim lost")
	}
	if got := testutil.ToFloat64(e.Metrics.StaleCleaned); got != 2 {
		t.Errorf("stale_claims_cleaned_total = %v, want 2", got)
	}
}

func TestRestartRebuildsDamagedRecord(t *testing.T) {
	e := newTestEnv(t, "dgxh100")
	live := preparetest.NewClaim("live").Device("gpu", "gpu-4").Build()
	dead := preparetest.NewClaim("dead").Device("gpu", "gpu-5").Build()
	for _, c := range []*resourceapi.ResourceClaim{live, dead} {
		if _, err := e.state.Prepare(e.Ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	for _, uid := range []string{"live", "dead"} {
		if err := os.WriteFile(filepath.Join(e.CkptDir, uid+".json"), []byte(`{"version":"v1","checksum":"x"`), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	s := restartWith(t, e, live) // "dead" is gone from the API
	if got := testutil.ToFloat64(e.Metrics.Damaged); got != 2 {
		t.Errorf("checkpoint_damaged_total = %v, want 2", got)
	}
	if s.index.get("live") == nil || !e.RecordExists("live") || !e.CDISpecExists("live") {
		t.Error("damaged record of a live claim not rebuilt")
	}
	if e.CDISpecExists("dead") || s.index.get("dead") != nil {
		t.Error("damaged record of a deleted claim: CDI spec kept")
	}
	if _, err := os.Stat(filepath.Join(e.CkptDir, "dead.json.damaged")); err != nil {
		t.Errorf("damaged file not kept for inspection: %v", err)
	}
}

func TestRestartUndoesInterruptedPrepareAndOrphanSpecs(t *testing.T) {
	e := newTestEnv(t, "dgxh100")
	store, _ := checkpoint.NewStore(e.CkptDir)
	started := &checkpoint.Claim{UID: "half", Namespace: "team-a", Name: "claim-half", State: checkpoint.PrepareStarted,
		Devices: []checkpoint.Device{{Pool: testNode, Device: "gpu-6", GPUUUID: e.Lib.GPUs()[6].UUID}}}
	if err := store.Save(started); err != nil {
		t.Fatal(err)
	}
	handler, _ := cdipkg.NewHandler(cdipkg.Options{CDIRoot: e.CDIRoot, NVML: e.Lib.NVML()})
	for _, uid := range []string{"half", "orphan"} {
		if _, err := handler.WriteClaimSpec(uid, []cdipkg.Device{{Name: "gpu-6", UUID: "GPU-x", Minor: 6}}); err != nil {
			t.Fatal(err)
		}
	}
	s := restartWith(t, e, preparetest.NewClaim("half").Build())
	for _, uid := range []string{"half", "orphan"} {
		if e.CDISpecExists(uid) || e.RecordExists(uid) {
			t.Errorf("%s: files left after restart", uid)
		}
	}
	if _, err := s.Prepare(e.Ctx, preparetest.NewClaim("next").Device("gpu", "gpu-6").Build()); err != nil {
		t.Errorf("gpu-6 not free after undoing the interrupted prepare: %v", err)
	}
}

// TestRollbackRebuildsNewerFormatMIGRecord is a rollback past a record
// format change (issue 40): the plugin finds a record of a newer format
// for a running dynamic-MIG claim. It must refuse to read it, and the
// claim it rebuilds from the API must be the one the container runs on:
// the MIG device the newer plugin made, not a second one, with the same
// CDI spec; unpreparing it then leaves no MIG device.
func TestRollbackRebuildsNewerFormatMIGRecord(t *testing.T) {
	e := newTestEnvWith(t, "dgxh100", preparetest.DynamicAll())
	if err := os.WriteFile(e.MigMinors, []byte(preparetest.MinorsFile(8)), 0o600); err != nil {
		t.Fatal(err)
	}
	claim := preparetest.NewClaim("m").Device("mig", e.Partition(t, 2, "1g.10gb")).Build()
	if _, err := e.state.Prepare(e.Ctx, claim); err != nil {
		t.Fatal(err)
	}
	before := e.MIGDevices(t, 2)
	spec, _ := os.ReadFile(cdiSpecPath(e, "m"))
	// What a release with record format v2 would have written.
	path := filepath.Join(e.CkptDir, "m.json")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(strings.Replace(string(data), `"version":"v1"`, `"version":"v2"`, 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	s := restartWith(t, e, claim)
	if got := testutil.ToFloat64(e.Metrics.Damaged); got != 1 {
		t.Errorf("checkpoint_damaged_total = %v, want 1 (the newer record refused)", got)
	}
	if _, err := os.Stat(path + ".damaged"); err != nil {
		t.Errorf("the newer record is not kept aside: %v", err)
	}
	after := e.MIGDevices(t, 2)
	if len(after) != 1 || after[0].UUID != before[0].UUID {
		t.Errorf("MIG devices on GPU 2 after the rebuild: %+v, were %+v", after, before)
	}
	if now, _ := os.ReadFile(cdiSpecPath(e, "m")); string(now) != string(spec) {
		t.Errorf("the claim's CDI spec changed in the rebuild:\nwas %s\nnow %s", spec, now)
	}
	if s.index.get("m") == nil || !e.RecordExists("m") {
		t.Fatal("the claim's record was not rebuilt")
	}
	if err := s.Unprepare(e.Ctx, "m"); err != nil {
		t.Fatal(err)
	}
	if left := e.MIGDevices(t, 2); len(left) != 0 {
		t.Errorf("MIG devices left after unprepare: %+v", left)
	}
}

// preparedClaims prepares n claims, one GPU each (n <= 8), and returns them.
func preparedClaims(t *testing.T, e *testEnv, n int) []*resourceapi.ResourceClaim {
	t.Helper()
	claims := make([]*resourceapi.ResourceClaim, n)
	for i := range claims {
		claims[i] = preparetest.NewClaim(fmt.Sprintf("c%d", i)).Device("gpu", fmt.Sprintf("gpu-%d", i)).Build()
		if _, err := e.state.Prepare(e.Ctx, claims[i]); err != nil {
			t.Fatal(err)
		}
	}
	return claims
}

// restoreWithClient restarts the plugin on e against client.
func restoreWithClient(t *testing.T, e *testEnv, client *fake.Clientset) *State {
	t.Helper()
	return restoreWithGetLimit(t, e, client, MaxClaimGets)
}

// restoreWithGetLimit is restoreWithClient on a plugin that GETs at most
// limit prepared claims at start, and LISTs them all beyond.
func restoreWithGetLimit(t *testing.T, e *testEnv, client *fake.Clientset, limit int) *State {
	t.Helper()
	e.Metrics = telemetry.NewMetrics(prometheus.NewRegistry())
	s := e.newState(t)
	s.claimGetLimit = limit
	if _, err := s.Restore(e.Ctx, client, e.Inventory, nil); err != nil {
		t.Fatal(err)
	}
	return s
}

// claimCalls counts the GETs and LISTs of claims client was asked.
func claimCalls(client *fake.Clientset) (gets, lists int) {
	for _, a := range client.Actions() {
		if a.GetResource().Resource != "resourceclaims" {
			continue
		}
		switch a.GetVerb() {
		case "list":
			lists++
		case "get":
			gets++
		}
	}
	return gets, lists
}

// otherNodesClaims are n claims in the API that no record here names.
func otherNodesClaims(n int) []runtime.Object {
	objs := make([]runtime.Object, n)
	for i := range objs {
		objs[i] = preparetest.NewClaim(fmt.Sprintf("elsewhere-%d", i)).Build()
	}
	return objs
}

// TestRestartChecksOnlyTheNodesClaims: the restart's check of the prepared
// claims costs what the node holds, not what the cluster holds (issue 37).
// It was one LIST of every claim in the cluster: with 2,400 claims of
// other nodes, a restart with 100 prepared claims took 211 ms to register
// against NVIDIA's 131 ms (BenchmarkPeerRestart). Now it GETs each of its
// own claims, at once (100 sequential GETs were 4x slower than NVIDIA).
func TestRestartChecksOnlyTheNodesClaims(t *testing.T) {
	e := newTestEnv(t, "dgxh100")
	claims := preparedClaims(t, e, 6)
	objs := otherNodesClaims(3000)
	for _, c := range claims[1:] { // c0 is gone
		objs = append(objs, c)
	}
	client := fake.NewClientset(objs...)
	s := restoreWithClient(t, e, client)
	if gets, lists := claimCalls(client); lists != 0 || gets != len(claims) {
		t.Errorf("restart with %d prepared claims among 3,000 others: %d LIST and %d GET of claims, want no LIST and a GET each",
			len(claims), lists, gets)
	}
	if s.index.get("c0") != nil || e.RecordExists("c0") {
		t.Error("claim deleted while down not cleaned up")
	}
	if got, _ := s.index.counts(); got != len(claims)-1 {
		t.Errorf("%d claims prepared after restart, want %d", got, len(claims)-1)
	}
}

// TestRestartListsClaimsWhenTheNodeHoldsMany: past the GET limit (the
// client's burst) one LIST is cheaper than waiting on the rate limiter;
// the check's outcome is the same.
func TestRestartListsClaimsWhenTheNodeHoldsMany(t *testing.T) {
	e := newTestEnv(t, "dgxh100")
	claims := preparedClaims(t, e, 3)
	client := fake.NewClientset(claims[1], claims[2]) // c0 is gone
	s := restoreWithGetLimit(t, e, client, 2)
	if gets, lists := claimCalls(client); lists != 1 || gets != 0 {
		t.Errorf("restart with 3 prepared claims, GET limit 2: %d LIST and %d GET of claims, want 1 LIST", lists, gets)
	}
	if s.index.get("c0") != nil || s.index.get("c1") == nil || s.index.get("c2") == nil {
		t.Error("after the LIST: want c0 cleaned up, c1 and c2 kept")
	}
}

// TestRestartKeepsEveryClaimWhenAGetFails: one GET that fails (not a "not
// found") fails the whole check, and a failed check unprepares nothing,
// not even the claims whose GET said they are gone.
func TestRestartKeepsEveryClaimWhenAGetFails(t *testing.T) {
	e := newTestEnv(t, "dgxh100")
	claims := preparedClaims(t, e, 3)
	client := fake.NewClientset() // every claim is gone, but for the one GET that fails
	client.PrependReactor("get", "resourceclaims", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.(k8stesting.GetActionImpl).Name == claims[1].Name {
			return true, nil, apierrors.NewServiceUnavailable("etcd is down")
		}
		return false, nil, nil
	})
	s := restoreWithClient(t, e, client)
	for _, c := range claims {
		if s.index.get(c.UID) == nil || !e.RecordExists(string(c.UID)) {
			t.Errorf("claim %s unprepared although a GET failed", c.UID)
		}
	}
	if got := testutil.ToFloat64(e.Metrics.StaleCleaned); got != 0 {
		t.Errorf("stale_claims_cleaned_total = %v, want 0", got)
	}
}

// TestRestartKeepsEveryClaimWhenListFails: a check that fails must never
// unprepare; not even a damaged record's CDI spec goes.
func TestRestartKeepsEveryClaimWhenListFails(t *testing.T) {
	e := newTestEnv(t, "dgxh100")
	claims := preparedClaims(t, e, 3)
	if err := os.WriteFile(filepath.Join(e.CkptDir, "c2.json"), []byte(`{"version":"v1","checksum":"x"`), 0o600); err != nil {
		t.Fatal(err)
	}
	client := fake.NewClientset() // every claim looks deleted, if the LIST answered
	for _, verb := range []string{"get", "list"} {
		client.PrependReactor(verb, "resourceclaims", func(k8stesting.Action) (bool, runtime.Object, error) {
			return true, nil, apierrors.NewServiceUnavailable("etcd is down")
		})
	}
	s := restoreWithClient(t, e, client)
	for _, c := range claims[:2] {
		if s.index.get(c.UID) == nil || !e.RecordExists(string(c.UID)) || !e.CDISpecExists(string(c.UID)) {
			t.Errorf("claim %s unprepared although the LIST failed", c.UID)
		}
	}
	if !e.CDISpecExists("c2") {
		t.Error("damaged record's CDI spec deleted although the LIST failed")
	}
	if got := testutil.ToFloat64(e.Metrics.StaleCleaned); got != 0 {
		t.Errorf("stale_claims_cleaned_total = %v, want 0", got)
	}
}

// TestRestartWithNothingPreparedAsksNothing: a node with no claims does
// not LIST every claim in the cluster at start.
func TestRestartWithNothingPreparedAsksNothing(t *testing.T) {
	e := newTestEnv(t, "dgxh100")
	client := fake.NewClientset()
	restoreWithClient(t, e, client)
	if a := client.Actions(); len(a) != 0 {
		t.Errorf("restart with nothing prepared made API calls: %v", a)
	}
}

// TestRestartReadsEveryPageOfClaims: a claim on a later page of the LIST is
// as present as one on the first.
func TestRestartReadsEveryPageOfClaims(t *testing.T) {
	e := newTestEnv(t, "dgxh100")
	claims := preparedClaims(t, e, 3) // c2 is gone
	pages := map[string]*resourceapi.ResourceClaimList{
		"":       {ListMeta: metav1.ListMeta{Continue: "page-2"}, Items: []resourceapi.ResourceClaim{*claims[0]}},
		"page-2": {Items: []resourceapi.ResourceClaim{*claims[1]}},
	}
	client := fake.NewClientset()
	client.PrependReactor("list", "resourceclaims", func(a k8stesting.Action) (bool, runtime.Object, error) {
		page, ok := pages[a.(k8stesting.ListActionImpl).ListOptions.Continue]
		if !ok {
			return true, nil, fmt.Errorf("no page %q", a.(k8stesting.ListActionImpl).ListOptions.Continue)
		}
		return true, page, nil
	})
	s := restoreWithGetLimit(t, e, client, 0) // LIST, however few
	for _, uid := range []types.UID{"c0", "c1"} {
		if s.index.get(uid) == nil {
			t.Errorf("claim %s, in the API, unprepared", uid)
		}
	}
	if s.index.get("c2") != nil {
		t.Error("claim c2, gone from the API, still prepared")
	}
}

// A damaged record whose claim could not be checked (the LIST failed) kept
// its CDI spec, but it was set aside all the same, so the next start saw a
// spec without a record and deleted it, while its pod ran on: the claim was
// never rebuilt. It is checked again at the next start now.
func TestDamagedRecordIsRebuiltAtTheStartAfterAFailedList(t *testing.T) {
	e := newTestEnv(t, "dgxh100")
	claims := preparedClaims(t, e, 3)
	if err := os.WriteFile(filepath.Join(e.CkptDir, "c2.json"), []byte(`{"version":"v1","checksum":"x"`), 0o600); err != nil {
		t.Fatal(err)
	}
	down := fake.NewClientset()
	down.PrependReactor("list", "resourceclaims", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewServiceUnavailable("etcd is down")
	})
	restoreWithClient(t, e, down)
	if !e.CDISpecExists("c2") {
		t.Fatal("damaged record's CDI spec deleted although the LIST failed")
	}

	up := fake.NewClientset(claims[0], claims[1], claims[2])
	s := restoreWithClient(t, e, up)
	if s.index.get("c2") == nil || !e.RecordExists("c2") || !e.CDISpecExists("c2") {
		t.Errorf("at the start after the failed LIST: claim c2 indexed %v, record %v, CDI spec %v; want it rebuilt",
			s.index.get("c2") != nil, e.RecordExists("c2"), e.CDISpecExists("c2"))
	}
	if got := testutil.ToFloat64(e.Metrics.Damaged); got != 1 {
		t.Errorf("checkpoint_damaged_total at the second start = %v, want 1 (the record still to check)", got)
	}
	if _, err := os.Stat(filepath.Join(e.CkptDir, "c2.json.damaged")); err != nil {
		t.Errorf("damaged file not kept for inspection: %v", err)
	}

	// Checked once: a third start does not count or rebuild it again.
	restoreWithClient(t, e, fake.NewClientset(claims[0], claims[1], claims[2]))
	if got := testutil.ToFloat64(e.Metrics.Damaged); got != 0 {
		t.Errorf("checkpoint_damaged_total at the third start = %v, want 0", got)
	}
}
