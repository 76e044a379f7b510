package plugin

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	cdispec "tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/gpuaas/gpu-dra-driver/pkg/mig"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/device"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/inventory"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/prepare"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/telemetry"
	"github.com/prometheus/client_golang/prometheus"

	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/cdi"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/checkpoint"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/dynamic-resource-allocation/structured"
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
	state     *prepare.State
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
	wrapCDI func(prepare.CDIWriter) prepare.CDIWriter
	// faults and inUseRetry, when set, go to each new State: the health
	// monitor, and how a MIG mode change waits for a held GPU.
	faults     device.FaultRecorder
	inUseRetry mig.InUseRetry
	// cdiHandler is the CDI handler of the State built last.
	cdiHandler *cdi.Handler
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
func (e *testEnv) newState(t testing.TB) *prepare.State {
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
	e.cdiHandler = handler
	var writer prepare.CDIWriter = handler
	if e.wrapCDI != nil {
		writer = e.wrapCDI(handler)
	}
	return prepare.NewState(prepare.StateConfig{NodeName: testNode, Devices: e.devices, NVML: e.lib, CDI: writer, Store: store,
		Metrics: e.metrics, MigMinorsPath: e.migMinors, Sharing: device.NewSharing(e.sharing), BootIDPath: e.bootID,
		Events: telemetry.NewNodeEvents(context.Background(), e.events, nil, testNode),
		Faults: e.faults, InUseRetry: e.inUseRetry})
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

func (b *claimBuilder) result(r resourceapi.DeviceRequestAllocationResult) *claimBuilder {
	a := b.claim.Status.Allocation
	a.Devices.Results = append(a.Devices.Results, r)
	return b
}

func (b *claimBuilder) build() *resourceapi.ResourceClaim { return b.claim }

func dynamicAll() *configapi.NodeConfig {
	return &configapi.NodeConfig{Default: configapi.GpuMode{MIG: configapi.MigDynamic}}
}

func (e *testEnv) migDevices(t *testing.T, gpuIndex int) []mig.Instance {
	t.Helper()
	dev, err := e.lib.DeviceByUUID(e.lib.GPUs()[gpuIndex].UUID)
	if err != nil {
		t.Fatal(err)
	}
	insts, err := mig.List(dev)
	if err != nil {
		t.Fatal(err)
	}
	return insts
}

// firstPartition returns the name of the first published partition of a
// profile on a GPU.
func (e *testEnv) partition(t *testing.T, gpuIndex int, profile string) string {
	t.Helper()
	for _, d := range e.devices {
		if d.Partition() != nil && d.GPU.Index == gpuIndex && d.Partition().Profile.Name == profile {
			return d.Name()
		}
	}
	t.Fatalf("no %s partition on GPU %d", profile, gpuIndex)
	return ""
}

// minorsFile fakes /proc/driver/nvidia-caps/mig-minors for a few GPUs.
func minorsFile(gpus int) string {
	var b strings.Builder
	minor := 1
	for g := range gpus {
		for gi := range 8 {
			fmt.Fprintf(&b, "gpu%d/gi%d/access %d\n", g, gi, minor)
			minor++
			for ci := range 8 {
				fmt.Fprintf(&b, "gpu%d/gi%d/ci%d/access %d\n", g, gi, ci, minor)
				minor++
			}
		}
	}
	return b.String()
}

// partitionAt is the dynamic device of a profile at a memory slice.
func (e *testEnv) partitionAt(t *testing.T, index int, profile string, start int) *device.AllocatableDevice {
	t.Helper()
	for i, d := range e.devices {
		if p := d.Partition(); p != nil && d.GPU.Index == index && p.Profile.Name == profile && p.Placement.Start == start {
			return &e.devices[i]
		}
	}
	t.Fatalf("no %s at memory slice %d on GPU %d", profile, start, index)
	return nil
}

// reopenMachine plays the plugin process's death and a new one's start:
// the old backend is abandoned (never shut down) and a new one opened on
// the same mock state directory, with the devices it publishes.
func (e *testEnv) reopenMachine(t *testing.T, cfg *configapi.NodeConfig) {
	t.Helper()
	lib, err := nvdev.Open(nvdev.Options{Backend: "mock:" + e.machine, MockSeed: testNode, MockStateDir: e.mockStateDir})
	if err != nil {
		t.Fatal(err)
	}
	e.lib = lib
	if e.sharing.NVML != nil {
		e.sharing.NVML = lib
	}
	e.devices = inventory.Discover(ktesting.NewLogger(t, ktesting.NewConfig()), lib, cfg).Devices
}

func restartWith(t *testing.T, e *testEnv, apiClaims ...*resourceapi.ResourceClaim) *prepare.State {
	t.Helper()
	e.metrics = telemetry.NewMetrics(prometheus.NewRegistry())
	s := e.newState(t)
	restore(t, e, s, apiClaims...)
	return s
}

// newModeEnv is a dynamic-MIG node on a persistent mock machine whose
// MIG mode changes wait briefly for a held GPU.
func newModeEnv(t *testing.T) *testEnv {
	t.Helper()
	e := newTestEnvIn(t, "dgxh100", dynamicAll(), t.TempDir())
	e.inUseRetry = fastInUseRetry
	e.state = e.newState(t)
	return e
}

// gpuNodes are the /dev/nvidiaN minors a claim's CDI spec names.
func gpuNodes(t *testing.T, e *testEnv, uid string) []int {
	t.Helper()
	var out []int
	for _, d := range readClaimSpec(t, e, uid).Devices {
		for _, n := range d.ContainerEdits.DeviceNodes {
			if m := gpuNodePath.FindStringSubmatch(n.Path); m != nil {
				minor, _ := strconv.Atoi(m[1])
				out = append(out, minor)
			}
		}
	}
	return out
}

func (e *testEnv) gpuDev(t *testing.T, index int) nvml.Device {
	t.Helper()
	dev, ret := e.lib.NVML().DeviceGetHandleByUUID(e.lib.GPUs()[index].UUID)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	return dev
}

func (e *testEnv) minorNow(t *testing.T, index int) int {
	t.Helper()
	minor, ret := e.gpuDev(t, index).GetMinorNumber()
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	return minor
}

var gpuNodePath = regexp.MustCompile(`^/dev/nvidia([0-9]+)$`)

// unitModes offers a mock DGX H100's GPU 0 as dynamic MIG, 1 as static
// MIG (3g + 2g + 1g + 1g made by the admin), 2 as 3 time-slice replicas,
// 3 shared, the others whole.
func unitModes(t *testing.T, units *bool) (*testEnv, *configapi.NodeConfig) {
	t.Helper()
	e := newTestEnv(t, "dgxh100")
	dev, err := e.lib.DeviceByUUID(e.lib.GPUs()[1].UUID)
	if err != nil {
		t.Fatal(err)
	}
	if err := mig.EnableMigMode(dev); err != nil {
		t.Fatal(err)
	}
	if _, err := mig.ApplyLayout(dev, []string{"3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"}); err != nil {
		t.Fatal(err)
	}
	e.lib.GPUs()[1].MigEnabled = true // as the admin's change reports after a re-open
	return e, &configapi.NodeConfig{GPUUnitCounters: units, GPUs: []configapi.GpuModeSelector{
		{Indexes: []int{0}, GpuMode: configapi.GpuMode{MIG: configapi.MigDynamic}},
		{Indexes: []int{1}, GpuMode: configapi.GpuMode{MIG: configapi.MigStatic}},
		{Indexes: []int{2}, GpuMode: configapi.GpuMode{TimeSlicing: &configapi.TimeSlicingMode{Replicas: 3}}},
		{Indexes: []int{3}, GpuMode: configapi.GpuMode{Shared: &configapi.SharedMode{}}},
	}}
}

// schedulerFeatures are the allocator features of a v1.37 scheduler with
// the gates the e2e cluster runs (partitionable devices, consumable
// capacity, prioritized lists, device taints).
var schedulerFeatures = structured.Features{
	AdminAccess: true, ConsumableCapacity: true, DeviceTaints: true,
	PartitionableDevices: true, PrioritizedList: true,
}

// classLister serves the catalog's classes of the benchmark.
type classLister map[string]*resourceapi.DeviceClass

func oneDeviceClaim(class string) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "claim", Namespace: "default", UID: "claim-uid"},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: class, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1},
		}}}},
	}
}

func (e *testEnv) gpuUUID(index int) string { return e.lib.GPUs()[index].UUID }

func (l classLister) List() ([]*resourceapi.DeviceClass, error) {
	var out []*resourceapi.DeviceClass
	for _, c := range l {
		out = append(out, c)
	}
	return out, nil
}

func (l classLister) Get(name string) (*resourceapi.DeviceClass, error) {
	if c, ok := l[name]; ok {
		return c, nil
	}
	return nil, fmt.Errorf("no DeviceClass %q", name)
}

// restore runs s's Restore as Start does, with apiClaims in the API.
func restore(t *testing.T, e *testEnv, s *prepare.State, apiClaims ...*resourceapi.ResourceClaim) {
	objs := make([]runtime.Object, 0, len(apiClaims))
	for _, c := range apiClaims {
		objs = append(objs, c)
	}
	if err := s.Restore(e.ctx, fake.NewClientset(objs...)); err != nil {
		t.Error(err)
	}
}

// fastInUseRetry waits as mig.DefaultInUseRetry does, in less time.
var fastInUseRetry = mig.InUseRetry{Within: 300 * time.Millisecond, First: 5 * time.Millisecond}

func readClaimSpec(t *testing.T, e *testEnv, uid string) *cdispec.Spec {
	t.Helper()
	spec, err := cdispec.ReadSpec(cdi.SpecPath(e.cdiRoot, uid), 0)
	if err != nil {
		t.Fatalf("reading the CDI spec of %s: %v", uid, err)
	}
	return spec
}

// apiSlices turns the plugin's pool into the ResourceSlices the
// resourceslice controller would store.
func apiSlices(res resourceslice.DriverResources) []*resourceapi.ResourceSlice {
	pool := res.Pools[testNode]
	var out []*resourceapi.ResourceSlice
	for i, s := range pool.Slices {
		out = append(out, &resourceapi.ResourceSlice{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", testNode, i)},
			Spec: resourceapi.ResourceSliceSpec{
				Driver:         configapi.DriverName,
				Pool:           resourceapi.ResourcePool{Name: testNode, Generation: 1, ResourceSliceCount: int64(len(pool.Slices))},
				NodeName:       ptr.To(testNode),
				Devices:        s.Devices,
				SharedCounters: s.SharedCounters,
			},
		})
	}
	return out
}

func celClass(name, expr string) *resourceapi.DeviceClass {
	return &resourceapi.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: expr}}}},
	}
}
