package plugin

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/maintenance"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/telemetry"

	"github.com/gpuaas/gpu-dra-driver/pkg/cdi"
	"github.com/gpuaas/gpu-dra-driver/pkg/cdi/cditest"
	"github.com/gpuaas/gpu-dra-driver/pkg/health"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev/nvmock"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/prepare"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/prepare/preparetest"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	specs "tags.cncf.io/container-device-interface/specs-go"
)

// Driver versions of the maintenance tests: the one installed at start and
// the one an upgrade installs.
const (
	startDriver    = "535.261.03"
	upgradedDriver = "550.54.15"
)

const maintenanceTaint = health.TaintKeyPrefix + maintenance.KindMaintenance

// maintEnv is a started plugin whose NVML session can be released, on a
// persistent mock machine (whose driver refuses to unload while a session
// is open) paired with a driver root holding the driver's files.
type maintEnv struct {
	*testEnv
	driver   *Driver
	pub      *capturePublisher
	session  *nvdev.Releasable
	opts     nvdev.Options
	root     *cditest.DriverRoot
	restarts chan error
	// dir holds the maintenance requests and answers of the last start.
	dir string
	// upgradeState, when set, stands in for the node's GPU Operator
	// upgrade-state label (followedUpgradeState).
	upgradeState func() string
	// releaseWait bounds a release's wait for the claims in flight; zero:
	// 100 ms, for the tests of a call that never ends.
	releaseWait time.Duration
}

func newMaintEnv(t *testing.T) *maintEnv {
	t.Helper()
	return newMaintEnvWith(t, func(*maintEnv) {})
}

// newMaintEnvWith is newMaintEnv with setup run before the plugin starts
// (the env's wrapCDI, releaseWait).
func newMaintEnvWith(t *testing.T, setup func(*maintEnv)) *maintEnv {
	t.Helper()
	dir := t.TempDir()
	e := newTestEnvIn(t, "dgxh100", everyMode(), dir)
	if err := os.WriteFile(e.MigMinors, []byte(preparetest.MinorsFile(8)), 0o600); err != nil {
		t.Fatal(err)
	}
	// The env's session knows no driver root: one that does replaces it.
	if err := e.Lib.Shutdown(); err != nil {
		t.Fatal(err)
	}
	m := &maintEnv{testEnv: e, root: cditest.NewDriverRoot(t, startDriver), restarts: make(chan error, 10)}
	m.opts = nvdev.Options{Backend: "mock:dgxh100", MockSeed: testNode, MockStateDir: dir, DriverRoot: m.root.Root}
	m.session = m.open(t)
	setup(m)
	m.start(t)
	return m
}

// open opens a session as a plugin process does at start.
func (m *maintEnv) open(t *testing.T) *nvdev.Releasable {
	t.Helper()
	lib, err := nvdev.Open(m.opts)
	if err != nil {
		t.Fatal(err)
	}
	s := nvdev.NewReleasable(lib, m.opts)
	t.Cleanup(func() { _ = s.Shutdown() })
	return s
}

// start plays the plugin's start on the env's directories and m.session:
// the CDI handler's driver files, the state, the health monitor the
// plugin runs, the maintenance.
func (m *maintEnv) start(t *testing.T) {
	t.Helper()
	m.Lib, m.DriverRoot, m.CDIHook = m.session, m.root.Root, cdi.HooksDisabled
	monitor := health.New(m.session, health.Config{ProbeInterval: 20 * time.Millisecond}, nil)
	m.faults = monitor
	m.state = m.newState(t)
	m.driver, m.pub = testDriver(t, m.testEnv, everyMode())
	m.driver.health = monitor
	m.dir = filepath.Join(t.TempDir(), "maintenance")
	m.driver.startMaintenance(m.Ctx, Options{NVML: m.session, Health: monitor, Maintenance: maintenance.Options{
		Session: m.session, Files: m.cdiHandler, Dir: m.dir,
		DriverRoot: m.root.Root, Interval: 10 * time.Millisecond, RunHealth: true, ReleaseWait: cmp.Or(m.releaseWait, 100*time.Millisecond),
		Restart:      func(err error) { m.restarts <- err },
		UpgradeState: m.readUpgradeState,
	}}, telemetry.NewNodeEvents(context.Background(), m.Events, nil, testNode))
	t.Cleanup(m.driver.maint.StopHealth)
	m.driver.watchHealth(m.Ctx)
	if err := m.driver.publish(m.Ctx); err != nil {
		t.Fatal(err)
	}
}

// readUpgradeState reads the stand-in of the upgrade-state label; "" (no
// label) until a test follows one.
func (m *maintEnv) readUpgradeState() string {
	if m.upgradeState == nil {
		return ""
	}
	return m.upgradeState()
}

// prepare prepares a claim of one device through the kubelet's call.
func (m *maintEnv) prepare(t *testing.T, uid, device string) error {
	t.Helper()
	res, err := m.driver.PrepareResourceClaims(m.Ctx, []*resourceapi.ResourceClaim{preparetest.NewClaim(uid).Device("r", device).Build()})
	if err != nil {
		t.Fatal(err)
	}
	return res[types.UID(uid)].Err
}

func (m *maintEnv) unprepare(t *testing.T, uid string) error {
	t.Helper()
	res, err := m.driver.UnprepareResourceClaims(m.Ctx, []kubeletplugin.NamespacedObject{{UID: types.UID(uid)}})
	if err != nil {
		t.Fatal(err)
	}
	return res[types.UID(uid)]
}

// taintedMaintenance counts the last published devices with the
// maintenance taint, and all of them.
func (m *maintEnv) taintedMaintenance(t *testing.T) (tainted, all int) {
	t.Helper()
	for _, s := range m.pub.last(t).Slices {
		for _, d := range s.Devices {
			all++
			for _, taint := range d.Taints {
				if taint.Key == maintenanceTaint && taint.Effect == resourceapi.DeviceTaintEffectNoSchedule {
					tainted++
				}
			}
		}
	}
	return tainted, all
}

// libraryOf is the host path the claim's spec mounts NVML's library from.
func (m *maintEnv) libraryOf(t *testing.T, uid string) string {
	t.Helper()
	data, err := os.ReadFile(cdi.SpecPath(m.CDIRoot, uid))
	if err != nil {
		t.Fatal(err)
	}
	var spec specs.Spec
	if err := json.Unmarshal(data, &spec); err != nil {
		t.Fatal(err)
	}
	for _, mount := range spec.ContainerEdits.Mounts {
		if strings.Contains(filepath.Base(mount.HostPath), "libnvidia-ml.so.") {
			return mount.HostPath
		}
	}
	t.Fatalf("the spec of %s mounts no libnvidia-ml: %+v", uid, spec.ContainerEdits.Mounts)
	return ""
}

// Issue 25 item 4: the plugin held its NVML session (and the health
// monitor's event set) for its whole life, so `rmmod nvidia` and
// `nvidia-smi -r` could not proceed while it ran. Released, it shuts NVML
// down (the mock driver then unloads), taints every device so that the
// scheduler places nothing there, is not ready, refuses new claims with a
// clear error, and still unprepares claims whose teardown needs no NVML;
// one that needs NVML (a dynamic MIG device to destroy) fails saying why
// and succeeds once the GPUs are reacquired.
func TestReleasedGPUsLetTheDriverGoAndComeBack(t *testing.T) {
	m := newMaintEnv(t)
	migDevice := m.Partition(t, 0, "1g.10gb")
	if err := m.prepare(t, "mig", migDevice); err != nil {
		t.Fatal(err)
	}
	if err := m.prepare(t, "whole", "gpu-3"); err != nil {
		t.Fatal(err)
	}
	if err := nvmock.UnloadDriver(m.MockStateDir); !errors.Is(err, nvmock.ErrDriverInUse) {
		t.Fatalf("unload while the plugin holds NVML: %v, want %v", err, nvmock.ErrDriverInUse)
	}

	if err := m.driver.maint.Release(m.Ctx, "a GPU reset"); err != nil {
		t.Fatal(err)
	}
	if err := nvmock.UnloadDriver(m.MockStateDir); err != nil {
		t.Fatalf("unload after the release: %v", err)
	}
	if m.driver.maint.HealthRunning() {
		t.Error("the health monitor (and its event set) still runs while released")
	}
	if err := m.driver.NotReady(); err == nil || !strings.Contains(err.Error(), "GPUs released for maintenance") {
		t.Errorf("NotReady while released = %v", err)
	}
	if tainted, all := m.taintedMaintenance(t); tainted != all || all == 0 {
		t.Errorf("%d of %d published devices tainted %s while released, want all", tainted, all, maintenanceTaint)
	}
	if err := m.prepare(t, "new", "gpu-4"); err == nil || !strings.Contains(err.Error(), "GPUs released for maintenance") {
		t.Errorf("prepare while released: %v, want the claim refused as GPUs released for maintenance", err)
	}
	if m.CDISpecExists("new") || m.RecordExists("new") {
		t.Error("a refused claim left a spec or a record")
	}
	if err := m.unprepare(t, "whole"); err != nil {
		t.Errorf("unprepare of a whole GPU while released: %v", err)
	}
	if m.CDISpecExists("whole") || m.RecordExists("whole") {
		t.Error("the whole GPU's claim is not unprepared")
	}
	if err := m.unprepare(t, "mig"); err == nil || !strings.Contains(err.Error(), "GPUs released for maintenance") {
		t.Errorf("unprepare of a dynamic MIG device while released: %v, want it to fail as GPUs released", err)
	}
	if !m.RecordExists("mig") {
		t.Error("the MIG claim's record is gone though its device was not destroyed")
	}

	if err := nvmock.LoadDriver(m.MockStateDir); err != nil {
		t.Fatal(err)
	}
	if err := m.driver.maint.Reacquire(m.Ctx, "reset done", func(error) {}); err != nil {
		t.Fatalf("Reacquire: %v", err)
	}
	if err := m.driver.NotReady(); err != nil {
		t.Errorf("NotReady after reacquiring: %v", err)
	}
	if !m.driver.maint.HealthRunning() {
		t.Error("the health monitor does not run again after reacquiring")
	}
	if tainted, _ := m.taintedMaintenance(t); tainted != 0 {
		t.Errorf("%d devices still tainted %s after reacquiring", tainted, maintenanceTaint)
	}
	if err := m.prepare(t, "new", "gpu-4"); err != nil {
		t.Errorf("prepare after reacquiring: %v", err)
	}
	if err := m.unprepare(t, "mig"); err != nil {
		t.Errorf("unprepare of the MIG claim after reacquiring: %v", err)
	}
	if left := m.MIGDevices(t, 0); len(left) != 0 {
		t.Errorf("MIG devices left after the unprepare: %+v", left)
	}
	if err := nvmock.UnloadDriver(m.MockStateDir); !errors.Is(err, nvmock.ErrDriverInUse) {
		t.Errorf("unload after reacquiring: %v, want the new session to hold the driver", err)
	}
}

// Issue 25 item 4: the driver files of the CDI specs were found once, at
// start; after a driver upgrade every claim prepared from then on named
// libnvidia-ml.so.<old>, a file the upgrade removed, and its containers
// could not load CUDA. The plugin now watches the version installed under
// the driver root: released for the upgrade, it takes the new version up
// by itself (a new process, which alone can load the new library), and
// prepares nothing with the old files meanwhile; the new process's claims
// name the new library, while the claims prepared before keep their specs
// (their containers run on the driver they started with).
func TestDriverUpgradeIsTakenUpForNewClaims(t *testing.T) {
	m := newMaintEnv(t)
	if err := m.prepare(t, "before", "gpu-3"); err != nil {
		t.Fatal(err)
	}
	oldLib := m.libraryOf(t, "before")
	if !strings.HasSuffix(oldLib, ".so."+startDriver) {
		t.Fatalf("the spec at start mounts %s, want version %s", oldLib, startDriver)
	}

	// The GPU Operator's flow: released, the driver unloaded, the new one
	// installed and loaded.
	if err := m.driver.maint.Release(m.Ctx, "driver upgrade"); err != nil {
		t.Fatal(err)
	}
	if err := nvmock.UnloadDriver(m.MockStateDir); err != nil {
		t.Fatal(err)
	}
	m.root.Upgrade(t, upgradedDriver)
	if err := nvmock.LoadDriver(m.MockStateDir); err != nil {
		t.Fatal(err)
	}
	m.driver.maint.Tick(m.Ctx)
	m.waitRestart(t)
	if !m.sawEvent(v1.EventTypeNormal, maintenance.ReasonDriverVersionChanged) {
		t.Errorf("no %s event; events: %v", maintenance.ReasonDriverVersionChanged, m.Events.Events)
	}
	if err := m.prepare(t, "stale", "gpu-4"); err == nil {
		t.Errorf("the old process prepared a claim after the upgrade, with the old driver's files: %s", m.libraryOf(t, "stale"))
	}

	// The new process.
	m.session = m.open(t)
	m.start(t)
	if v := m.cdiHandler.DriverVersion(); v != upgradedDriver {
		t.Errorf("the new process's specs name driver %q, want %q", v, upgradedDriver)
	}
	if err := m.prepare(t, "after", "gpu-4"); err != nil {
		t.Fatal(err)
	}
	if lib := m.libraryOf(t, "after"); lib != m.root.HostPath(m.root.LibPath("libnvidia-ml.so")) {
		t.Errorf("a claim prepared after the upgrade mounts %s, want the new %s", lib, m.root.LibPath("libnvidia-ml.so"))
	}
	if lib := m.libraryOf(t, "before"); lib != oldLib {
		t.Errorf("the spec of a claim prepared before the upgrade changed to %s", lib)
	}
}

// A driver upgraded under a session the plugin still holds (a package
// upgrade on the host, which swaps the files while the old module runs):
// the watch lets go of the GPUs itself and starts again for the new
// library, rather than handing out files that are gone.
func TestDriverUpgradedUnderALiveSessionIsTakenUp(t *testing.T) {
	m := newMaintEnv(t)
	m.root.Upgrade(t, upgradedDriver)
	m.driver.maint.Tick(m.Ctx)
	m.waitRestart(t)
	if err := m.driver.NotReady(); err == nil {
		t.Error("ready after the upgrade, with the old driver's files")
	}
	if err := nvmock.UnloadDriver(m.MockStateDir); err != nil {
		t.Errorf("unload after the watch took the upgrade up: %v (the old session still holds the driver)", err)
	}
}

func (m *maintEnv) waitRestart(t *testing.T) {
	t.Helper()
	select {
	case err := <-m.restarts:
		if !errors.Is(err, nvdev.ErrNewProcessNeeded) {
			t.Fatalf("restarted for %v, want %v", err, nvdev.ErrNewProcessNeeded)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the plugin did not start again for the new driver")
	}
}

func (m *maintEnv) sawEvent(eventType, reason string) bool {
	return m.Events.Saw(eventType, reason)
}

// An operator's --release-gpus and --reacquire-gpus reach the plugin
// through its data directory and are answered there.
func TestMaintenanceRequestsAreAnswered(t *testing.T) {
	m := newMaintEnv(t)
	dir := m.dir
	ctx, cancel := context.WithCancel(m.Ctx)
	defer cancel()
	m.driver.maint.Watch(ctx)
	for _, step := range []struct{ action, want string }{
		{maintenance.ActionRelease, maintenance.StateReleased},
		{maintenance.ActionReacquire, maintenance.StateServing},
	} {
		if step.action == maintenance.ActionReacquire {
			if err := nvmock.UnloadDriver(m.MockStateDir); err != nil {
				t.Fatalf("unload while released: %v", err)
			}
			if err := nvmock.LoadDriver(m.MockStateDir); err != nil {
				t.Fatal(err)
			}
		}
		id, err := maintenance.Request(dir, step.action)
		if err != nil {
			t.Fatal(err)
		}
		wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
		st, err := maintenance.Wait(wctx, dir, id, step.want)
		wcancel()
		if err != nil {
			t.Fatalf("%s: %v (status %+v)", step.action, err, st)
		}
		if st.DriverVersion != startDriver {
			t.Errorf("%s: status names driver %q, want %q", step.action, st.DriverVersion, startDriver)
		}
	}
}

// A release waits for prepares and unprepares in flight, but not for one
// that never ends: it fails within its bound, the GPUs stay in service,
// and the kubelet's calls are not held behind it.
func TestReleaseBehindAHungCallFailsTheReleaseNotTheNode(t *testing.T) {
	m := newMaintEnv(t)
	hung, err := m.driver.maint.Hold(m.Ctx) // a claim whose prepare never returns
	if err != nil {
		t.Fatal(err)
	}
	defer hung()
	err = m.driver.maint.Release(m.Ctx, "a GPU reset")
	if err == nil || !strings.Contains(err.Error(), "not released: prepares or unprepares still in flight after") {
		t.Fatalf("release behind a hung call: err = %v", err)
	}
	if m.driver.maint.Released() {
		t.Error("the GPUs are released though the release failed")
	}
	if err := m.prepare(t, "after", "gpu-4"); err != nil {
		t.Errorf("prepare after the failed release: %v", err)
	}
}

// Issue 53: the maintenance hold was taken once per kubelet call, for all
// of its claims: a release asked for while a call prepared its first
// claim waited for the whole call, and the call went on preparing its
// other claims on GPUs the node was asked to let go of. The hold is per
// claim: the release waits for the claim in progress only, and the claims
// after it are refused as the GPUs being (or by then) released, which the
// kubelet retries.
func TestReleaseWaitsForTheClaimInProgressNotTheCall(t *testing.T) {
	hook := &heldCDI{uid: "first", entered: make(chan struct{}), open: make(chan struct{})}
	m := newMaintEnvWith(t, func(m *maintEnv) {
		m.releaseWait = time.Minute // a failure, not a wait, if the release waits for the call
		m.wrapCDI = func(w prepare.CDIWriter) prepare.CDIWriter { hook.CDIWriter = w; return hook }
	})
	claims := []*resourceapi.ResourceClaim{
		preparetest.NewClaim("first").Device("r", "gpu-3").Build(),
		preparetest.NewClaim("second").Device("r", "gpu-4").Build(),
		preparetest.NewClaim("third").Device("r", "gpu-5").Build(),
	}
	prepared := make(chan map[types.UID]kubeletplugin.PrepareResult, 1)
	go func() {
		res, err := m.driver.PrepareResourceClaims(m.Ctx, claims)
		if err != nil {
			t.Error(err)
		}
		prepared <- res
	}()
	select {
	case <-hook.entered:
	case res := <-prepared:
		t.Fatalf("the first claim never reached its spec: %v", res["first"].Err)
	}
	released := make(chan error, 1)
	go func() { released <- m.driver.maint.Release(m.Ctx, "a driver upgrade") }()
	m.awaitReleaseAsked(t)
	close(hook.open)
	res := <-prepared
	if err := <-released; err != nil {
		t.Fatalf("release while a call prepared its first claim: %v", err)
	}
	if err := res["first"].Err; err != nil || !m.RecordExists("first") {
		t.Errorf("the claim in progress when the release was asked for: err = %v, recorded %v", err, m.RecordExists("first"))
	}
	for _, uid := range []string{"second", "third"} {
		if err := res[types.UID(uid)].Err; err == nil || !strings.Contains(err.Error(), "for maintenance") {
			t.Errorf("claim %s, after the release was asked for: err = %v, want it refused for maintenance", uid, err)
		}
		if m.RecordExists(uid) || m.CDISpecExists(uid) {
			t.Errorf("claim %s was prepared after the release was asked for", uid)
		}
	}
}

// awaitReleaseAsked waits until a kubelet call is refused as the GPUs
// being released (the unprepare of a claim never prepared, which is
// otherwise a no-op), or fails the test after a while.
func (m *maintEnv) awaitReleaseAsked(t *testing.T) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if err := m.unprepare(t, "probe"); err != nil && strings.Contains(err.Error(), "being released for maintenance") {
			return
		}
	}
	t.Error("no kubelet call refused while the release waits for the claim in progress")
}

// heldCDI holds the spec write of claim uid until open is closed, telling
// entered once it is there: a prepare in progress for as long as a test
// needs.
type heldCDI struct {
	prepare.CDIWriter
	uid           string
	entered, open chan struct{}
	once          sync.Once
}

func (h *heldCDI) WriteClaimSpec(uid string, devices []cdi.Device) (map[string]string, error) {
	if uid == h.uid {
		h.once.Do(func() { close(h.entered); <-h.open })
	}
	return h.CDIWriter.WriteClaimSpec(uid, devices)
}

// Issue 53: a claim's hold waited in RLock, which takes no context: behind
// a reacquire that waits for a claim that does not end, every kubelet call
// on the node waited too, past the kubelet's deadline. The hold's wait
// ends with the call's context, and the reacquire completes once the
// claim ends.
func TestAHoldBehindAWaitingReacquireEndsWithItsContext(t *testing.T) {
	m := newMaintEnv(t)
	if err := m.driver.maint.Release(m.Ctx, "a GPU reset"); err != nil {
		t.Fatal(err)
	}
	hung, err := m.driver.maint.Hold(m.Ctx) // a teardown that does not end
	if err != nil {
		t.Fatal(err)
	}
	reacquired := make(chan error, 1)
	go func() { reacquired <- m.driver.maint.Reacquire(m.Ctx, "reset done", func(error) {}) }()
	for !m.unprepareEndsWithItsContext(t) {
		time.Sleep(5 * time.Millisecond) // the reacquire is not yet waiting for the gate
	}
	hung()
	if err := <-reacquired; err != nil {
		t.Fatalf("reacquire once the claim ended: %v", err)
	}
	if err := m.prepare(t, "after", "gpu-4"); err != nil {
		t.Errorf("prepare after the reacquire: %v", err)
	}
}

// unprepareEndsWithItsContext calls unprepare (of a claim never prepared)
// with a short context, and says whether its wait for the maintenance
// gate ended with it; a call still waiting long after fails the test.
func (m *maintEnv) unprepareEndsWithItsContext(t *testing.T) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(m.Ctx, 50*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		res, err := m.driver.UnprepareResourceClaims(ctx, []kubeletplugin.NamespacedObject{{UID: "probe"}})
		done <- errors.Join(err, res["probe"])
	}()
	select {
	case err := <-done:
		return err != nil && strings.Contains(err.Error(), "waiting for the GPUs' reacquire or release to end")
	case <-time.After(10 * time.Second):
		t.Fatal("an unprepare behind a waiting reacquire still waits, long past its context")
		return false
	}
}
