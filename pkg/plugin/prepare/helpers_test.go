package prepare

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/device"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/inventory"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/telemetry"

	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/cdi"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/checkpoint"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"
)

const testNode = "node-a"

// testEnv is a State on a mock machine with its directories, so that a
// second State on the same directories plays the restarted plugin.
type testEnv struct {
	t       *testing.T
	lib     nvdev.Interface
	cdiRoot string
	ckptDir string
	// migMinors is a fake /proc/driver/nvidia-caps/mig-minors.
	migMinors string
	state     *State
	metrics   *telemetry.Metrics
	devices   []device.AllocatableDevice
	ctx       context.Context
	// sharing wires each (re)started State's sharing settings; the zero
	// value has no driver tools.
	sharing device.SharingOptions
	// machine is the mock machine's name; bootID a fake boot_id file.
	machine string
	bootID  string
	// mockStateDir keeps the mock machine in a file when not empty, so that
	// a new backend on it plays the restarted process (reopenMachine).
	mockStateDir string
	// driverRoot and cdiHook, when set, give each new State's CDI handler
	// a driver's files and NVIDIA's hooks, as on a GPU node.
	driverRoot, cdiHook string
	// wrapCDI, when set, wraps each new State's CDI writer (fault hooks).
	wrapCDI func(CDIWriter) CDIWriter
	// events are the Node events of every State of the env.
	events *eventLog
}

// eventLog records Node events as "<type> <reason> <note>".
type eventLog struct {
	mu     sync.Mutex
	events []string
}

func (l *eventLog) Eventf(_, _ runtime.Object, eventtype, reason, _, note string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, eventtype+" "+reason+" "+fmt.Sprintf(note, args...))
}

// withReason returns the events recorded with a reason.
func (l *eventLog) withReason(reason string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, e := range l.events {
		if strings.HasPrefix(e, "Warning "+reason+" ") {
			out = append(out, e)
		}
	}
	return out
}

func newTestEnv(t testing.TB, machine string) *testEnv {
	t.Helper()
	return newTestEnvWith(t, machine, &configapi.NodeConfig{})
}

// newTestEnvWith builds the env for a node configuration (GPU modes).
func newTestEnvWith(t testing.TB, machine string, cfg *configapi.NodeConfig) *testEnv {
	t.Helper()
	return newTestEnvIn(t, machine, cfg, "")
}

// newTestEnvIn is newTestEnvWith on a mock machine kept in mockStateDir;
// empty keeps it in memory.
func newTestEnvIn(t testing.TB, machine string, cfg *configapi.NodeConfig, mockStateDir string) *testEnv {
	t.Helper()
	lib, err := nvdev.Open(nvdev.Options{Backend: "mock:" + machine, MockSeed: testNode, MockStateDir: mockStateDir})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	_, ctx := ktesting.NewTestContext(t)
	e := &testEnv{lib: lib, cdiRoot: filepath.Join(dir, "cdi"), ckptDir: filepath.Join(dir, "claims"),
		migMinors: filepath.Join(dir, "mig-minors"), ctx: ctx, machine: machine, bootID: filepath.Join(dir, "boot_id"),
		mockStateDir: mockStateDir, events: &eventLog{}}
	if err := os.WriteFile(e.bootID, []byte("boot-1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if tt, ok := t.(*testing.T); ok {
		e.t = tt
	}
	// A fake /proc/devices beside the fake mig-minors: the CDI handler reads
	// the capability nodes' major there.
	if err := os.WriteFile(filepath.Join(dir, "devices"), []byte("Character devices:\n195 nvidia\n237 nvidia-caps\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	e.devices = inventory.Discover(ktesting.NewLogger(t, ktesting.NewConfig()), lib, cfg).Devices
	e.state = e.newState(t)
	return e
}

// newState builds a State on the env's directories, as a (re)started
// plugin would.
func (e *testEnv) newState(t testing.TB) *State {
	t.Helper()
	handler, err := cdi.NewHandler(cdi.Options{CDIRoot: e.cdiRoot, NVML: e.lib.NVML(),
		DriverRoot: e.driverRoot, CDIHookPath: e.cdiHook,
		ProcDevicesPath: filepath.Join(filepath.Dir(e.migMinors), "devices")})
	if err != nil {
		t.Fatal(err)
	}
	store, err := checkpoint.NewStore(e.ckptDir)
	if err != nil {
		t.Fatal(err)
	}
	var writer CDIWriter = handler
	if e.wrapCDI != nil {
		writer = e.wrapCDI(handler)
	}
	return NewState(StateConfig{NodeName: testNode, Devices: e.devices, NVML: e.lib, CDI: writer, Store: store,
		Metrics: e.metrics, MigMinorsPath: e.migMinors, Sharing: device.NewSharing(e.sharing), BootIDPath: e.bootID,
		Events: telemetry.NewNodeEvents(context.Background(), e.events, nil, testNode)})
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

func (e *testEnv) cdiSpecExists(uid string) bool { return fileExists(cdi.SpecPath(e.cdiRoot, uid)) }

func (e *testEnv) recordExists(uid string) bool {
	return fileExists(filepath.Join(e.ckptDir, uid+".json"))
}

// claimBuilder makes allocated claims the way the scheduler leaves them.
type claimBuilder struct{ claim *resourceapi.ResourceClaim }

func newClaim(uid string) *claimBuilder {
	return &claimBuilder{claim: &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "claim-" + uid, UID: types.UID(uid)},
		Status: resourceapi.ResourceClaimStatus{
			Allocation:  &resourceapi.AllocationResult{},
			ReservedFor: []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "p", UID: "pod-" + types.UID(uid)}},
		},
	}}
}

func (b *claimBuilder) device(request, name string) *claimBuilder {
	return b.result(resourceapi.DeviceRequestAllocationResult{
		Request: request, Driver: configapi.DriverName, Pool: testNode, Device: name,
	})
}

func (b *claimBuilder) adminDevice(request, name string) *claimBuilder {
	return b.result(resourceapi.DeviceRequestAllocationResult{
		Request: request, Driver: configapi.DriverName, Pool: testNode, Device: name, AdminAccess: ptr.To(true),
	})
}

func (b *claimBuilder) result(r resourceapi.DeviceRequestAllocationResult) *claimBuilder {
	a := b.claim.Status.Allocation
	a.Devices.Results = append(a.Devices.Results, r)
	return b
}

func (b *claimBuilder) config(source resourceapi.AllocationConfigSource, raw string, requests ...string) *claimBuilder {
	a := b.claim.Status.Allocation
	a.Devices.Config = append(a.Devices.Config, resourceapi.DeviceAllocationConfiguration{
		Source: source, Requests: requests,
		DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
			Driver: configapi.DriverName, Parameters: runtime.RawExtension{Raw: []byte(raw)},
		}},
	})
	return b
}

func (b *claimBuilder) build() *resourceapi.ResourceClaim { return b.claim }

func typesUID(s string) types.UID { return types.UID(s) }

func everyMode() *configapi.NodeConfig {
	return &configapi.NodeConfig{GPUs: []configapi.GpuModeSelector{
		{Indexes: []int{0}, GpuMode: configapi.GpuMode{MIG: configapi.MigDynamic}},
		{Indexes: []int{1}, GpuMode: configapi.GpuMode{TimeSlicing: &configapi.TimeSlicingMode{Replicas: 4}}},
		{Indexes: []int{2}, GpuMode: configapi.GpuMode{Shared: &configapi.SharedMode{}}},
	}}
}
