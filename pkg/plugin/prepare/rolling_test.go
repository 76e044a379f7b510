package prepare

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/device"

	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	cdipkg "github.com/gpuaas/gpu-dra-driver/pkg/cdi"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/checkpoint"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/prepare/preparetest"
	"github.com/gpuaas/gpu-dra-driver/pkg/timeslice"
	resourceapi "k8s.io/api/resource/v1"
)

// blockingCDI holds WriteClaimSpec until released, so a test can act while a
// prepare is in flight.
type blockingCDI struct {
	CDIWriter
	entered chan struct{}
	release chan struct{}
}

func newBlockingCDI(w CDIWriter) *blockingCDI {
	return &blockingCDI{CDIWriter: w, entered: make(chan struct{}), release: make(chan struct{})}
}

func (b *blockingCDI) WriteClaimSpec(uid string, devs []cdipkg.Device) (map[string]string, error) {
	close(b.entered)
	<-b.release
	return b.CDIWriter.WriteClaimSpec(uid, devs)
}

// returnsWithin runs f and reports whether it returned within d; the
// returned channel yields f's error once it does.
func returnsWithin(d time.Duration, f func() error) (bool, <-chan error) {
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		done <- err
		return true, done
	case <-time.After(d):
		return false, done
	}
}

// secondInstance starts the new plugin instance of a rolling update on the
// env's directories and mock machine, and restores as Start does.
func secondInstance(t *testing.T, e *testEnv, apiClaims ...*resourceapi.ResourceClaim) *State {
	t.Helper()
	s := e.newState(t)
	restore(t, e, s, apiClaims...)
	return s
}

// Item 3: the old instance (A) prepares a claim after the new one (B)
// started; the kubelet asks B to unprepare it.
func TestRollingUpdateNewInstanceUnpreparesClaimOfOldOne(t *testing.T) {
	e := newTestEnvWith(t, "dgxh100", preparetest.DynamicAll())
	a := e.state
	b := secondInstance(t, e)
	claim := preparetest.NewClaim("late").Device("mig", e.Partition(t, 2, "1g.10gb")).Build()
	if _, err := a.Prepare(e.Ctx, claim); err != nil {
		t.Fatal(err)
	}
	if err := b.Unprepare(e.Ctx, "late"); err != nil {
		t.Fatalf("B unprepare: %v", err)
	}
	if e.CDISpecExists("late") || e.RecordExists("late") {
		t.Errorf("B's unprepare left spec %v, record %v", e.CDISpecExists("late"), e.RecordExists("late"))
	}
	if left := e.MIGDevices(t, 2); len(left) != 0 {
		t.Errorf("B's unprepare left MIG devices: %+v", left)
	}
	// A learns that the device is free again.
	if _, err := a.Prepare(e.Ctx, preparetest.NewClaim("next").Device("mig", e.Partition(t, 2, "1g.10gb")).Build()); err != nil {
		t.Errorf("A cannot prepare the freed device: %v", err)
	}
}

// Item 3: the new instance's Restore runs while the old one is half-way
// through a dynamic MIG prepare (record PrepareStarted, MIG device made).
func TestRollingUpdateRestoreWaitsForInFlightPrepare(t *testing.T) {
	e := newTestEnvWith(t, "dgxh100", preparetest.DynamicAll())
	a := e.state
	block := newBlockingCDI(a.cdi)
	a.cdi = block
	claim := preparetest.NewClaim("busy").Device("mig", e.Partition(t, 3, "2g.20gb")).Build()
	prepared := make(chan error, 1)
	go func() { _, err := a.Prepare(e.Ctx, claim); prepared <- err }()
	<-block.entered

	b := e.newState(t)
	returned, restored := returnsWithin(time.Second, func() error { restore(t, e, b, claim); return nil })
	if returned {
		t.Error("B's Restore ran while A's prepare was in flight")
	}
	close(block.release)
	if err := <-prepared; err != nil {
		t.Fatalf("A's prepare: %v", err)
	}
	if err := <-restored; err != nil {
		t.Fatalf("B's Restore: %v", err)
	}
	if !e.CDISpecExists("busy") || !e.RecordExists("busy") {
		t.Errorf("after B's Restore: spec %v, record %v", e.CDISpecExists("busy"), e.RecordExists("busy"))
	}
	if n := len(e.MIGDevices(t, 3)); n != 1 {
		t.Errorf("A's MIG device undone by B's Restore: %d MIG devices", n)
	}
	if err := b.Unprepare(e.Ctx, "busy"); err != nil || len(e.MIGDevices(t, 3)) != 0 {
		t.Errorf("B cannot unprepare A's claim: %v", err)
	}
}

// Item 3: sharing settings are counted across instances: B must not apply
// them a second time, nor reset them under A's claim.
func TestRollingUpdateSharingCountedAcrossInstances(t *testing.T) {
	e := newTestEnvWith(t, "dgxh100", sharingNode())
	run := withTools(t, e)
	a := e.state
	b := secondInstance(t, e)
	if _, err := a.Prepare(e.Ctx, preparetest.NewClaim("a").Device("gpu", "gpu-4-ts-0").Build()); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Prepare(e.Ctx, preparetest.NewClaim("b").Device("gpu", "gpu-4-ts-1").Build()); err != nil {
		t.Fatal(err)
	}
	if err := b.Unprepare(e.Ctx, "b"); err != nil {
		t.Fatal(err)
	}
	set := "nvidia-smi compute-policy -i " + e.GPUUUID(4) + " --set-timeslice=3"
	if got := run.take(); !slices.Equal(got, []string{set}) {
		t.Errorf("commands = %v, want only A's %q", got, set)
	}
	if err := b.Unprepare(e.Ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if got := run.take(); len(got) != 1 || !strings.HasSuffix(got[0], "--set-timeslice=0") {
		t.Errorf("last claim's unprepare on B: commands %v, want the reset", got)
	}
}

// Item 7: an unprepare that arrives while the claim's prepare is in flight
// waits for it and then undoes it.
func TestUnprepareWaitsForInFlightPrepare(t *testing.T) {
	e := newTestEnv(t, "dgxh100")
	block := newBlockingCDI(e.state.cdi)
	e.state.cdi = block
	prepared := make(chan error, 1)
	go func() {
		_, err := e.state.Prepare(e.Ctx, preparetest.NewClaim("c").Device("gpu", "gpu-1").Build())
		prepared <- err
	}()
	<-block.entered
	returned, unprepared := returnsWithin(500*time.Millisecond, func() error { return e.state.Unprepare(e.Ctx, "c") })
	if returned {
		t.Error("unprepare returned while the prepare was in flight")
	}
	close(block.release)
	if err := <-prepared; err != nil {
		t.Fatal(err)
	}
	if err := <-unprepared; err != nil {
		t.Fatal(err)
	}
	if e.CDISpecExists("c") || e.RecordExists("c") {
		t.Errorf("claim unprepared during its prepare left spec %v, record %v", e.CDISpecExists("c"), e.RecordExists("c"))
	}
}

// cancellingCDI cancels the call's context, as the kubelet does when it
// gives up on a prepare, and then fails.
type cancellingCDI struct {
	CDIWriter
	cancel context.CancelFunc
}

func (c cancellingCDI) WriteClaimSpec(string, []cdipkg.Device) (map[string]string, error) {
	c.cancel()
	return nil, errors.New("disk full")
}

// ctxRunner fails on a cancelled context, as exec.CommandContext does.
type ctxRunner struct{ *fakeRunner }

func (r ctxRunner) Run(ctx context.Context, c timeslice.Cmd) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return r.fakeRunner.Run(ctx, c)
}

// Item 7: the rollback of a failed prepare runs to the end although the
// gRPC call's context is cancelled.
func TestRollbackOnCancelledContext(t *testing.T) {
	e := newTestEnvWith(t, "dgxh100", sharingNode())
	run := withTools(t, e)
	e.Sharing.Runner = ctxRunner{run}
	e.state = e.newState(t)
	ctx, cancel := context.WithCancel(e.Ctx)
	defer cancel()
	e.state.cdi = cancellingCDI{CDIWriter: e.state.cdi, cancel: cancel}
	_, err := e.state.Prepare(ctx, preparetest.NewClaim("a").Device("gpu", "gpu-4-ts-0").Build())
	if err == nil || strings.Contains(err.Error(), "rolling back") {
		t.Fatalf("prepare error = %v, want the CDI failure alone", err)
	}
	if got := run.take(); len(got) != 2 || !strings.HasSuffix(got[1], "--set-timeslice=0") {
		t.Errorf("rollback did not reset the interval: %v", got)
	}
	if e.RecordExists("a") {
		t.Error("rolled-back claim left its record")
	}
}

// Item 8: an interrupted prepare read before a completed claim on the same
// GPU is undone without resetting the GPU under the completed claim.
func TestRestoreUndoesInterruptedPrepareWithoutResettingOthers(t *testing.T) {
	e := newTestEnvWith(t, "dgxh100", sharingNode())
	run := withTools(t, e)
	done := preparetest.NewClaim("b-done").Device("gpu", "gpu-4-ts-1").Build()
	if _, err := e.state.Prepare(e.Ctx, done); err != nil {
		t.Fatal(err)
	}
	long := timeslice.Settings{Strategy: configapi.TimeSlicingStrategy, Interval: configapi.LongTimeSlice}
	half := &checkpoint.Claim{UID: "a-half", Namespace: "team-a", Name: "claim-a-half", State: checkpoint.PrepareStarted,
		Devices: []checkpoint.Device{{Pool: testNode, Device: "gpu-4-ts-0", GPUUUID: e.GPUUUID(4), Sharing: &long}}}
	if err := e.state.env.Store.Save(half); err != nil {
		t.Fatal(err)
	}
	run.take()
	s := restartWith(t, e, done, preparetest.NewClaim("a-half").Build())
	if got := run.take(); slices.ContainsFunc(got, func(c string) bool { return strings.HasSuffix(c, "--set-timeslice=0") }) {
		t.Errorf("interval reset under a running claim: %v", got)
	}
	if e.RecordExists("a-half") {
		t.Error("interrupted prepare not undone")
	}
	if n, st := s.env.Sharing.Holders(e.GPUUUID(4)); n != 1 || st != long {
		t.Errorf("after restore: %d holders of %v, want 1 of %v", n, st, long)
	}
}

// Item 12: a prepared claim is prepared again (the kubelet retries after a
// restart) although its device is no longer published.
func TestRePrepareOfClaimWhoseDeviceVanished(t *testing.T) {
	e := newTestEnv(t, "dgxh100")
	claim := preparetest.NewClaim("kept").Device("gpu", "gpu-1").Build()
	before, err := e.state.Prepare(e.Ctx, claim)
	if err != nil {
		t.Fatal(err)
	}
	e.Devices = slices.DeleteFunc(slices.Clone(e.Devices), func(d device.AllocatableDevice) bool { return d.Name() == "gpu-1" })
	s := restartWith(t, e, claim)
	after, err := s.Prepare(e.Ctx, claim)
	if err != nil {
		t.Fatalf("re-prepare: %v", err)
	}
	if fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("re-prepare = %v, want the recorded %v", after, before)
	}
}

// Item 12: temporary files of a write interrupted by a crash are removed
// at restart.
func TestRestartRemovesCheckpointTempFiles(t *testing.T) {
	e := newTestEnv(t, "dgxh100")
	tmp := filepath.Join(e.CkptDir, ".tmp-x.json-123")
	if err := os.WriteFile(tmp, []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	restartWith(t, e)
	if preparetest.FileExists(tmp) {
		t.Error("checkpoint temp file left after restart")
	}
}

// A prepare whose rollback failed leaves its record (PrepareStarted) and its
// MIG device; the kubelet's retry undoes that first instead of overwriting
// the record that names the device.
func TestRetriedPrepareUndoesUnfinishedAttempt(t *testing.T) {
	e := newTestEnvWith(t, "dgxh100", preparetest.DynamicAll())
	claim := preparetest.NewClaim("m").Device("mig", e.Partition(t, 1, "3g.40gb")).Build()
	if _, err := e.state.Prepare(e.Ctx, claim); err != nil {
		t.Fatal(err)
	}
	rec := e.state.index.get("m")
	rec.State = checkpoint.PrepareStarted
	if err := e.state.env.Store.Save(rec); err != nil {
		t.Fatal(err)
	}
	e.state.index.remove(rec)
	first := rec.Devices[0].CreatedMIG.UUID

	if _, err := e.state.Prepare(e.Ctx, claim); err != nil {
		t.Fatalf("retried prepare: %v", err)
	}
	left := e.MIGDevices(t, 1)
	if len(left) != 1 || left[0].UUID == first {
		t.Errorf("MIG devices after the retry: %+v; want one, not the first attempt's %s", left, first)
	}
	if err := e.state.Unprepare(e.Ctx, "m"); err != nil || len(e.MIGDevices(t, 1)) != 0 {
		t.Errorf("unprepare after the retry: %v, %d MIG devices left", err, len(e.MIGDevices(t, 1)))
	}
}
