package prepare

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/inventory"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	cdipkg "github.com/gpuaas/gpu-dra-driver/pkg/cdi"
	"github.com/gpuaas/gpu-dra-driver/pkg/mps"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/device"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/prepare/preparetest"
	"github.com/gpuaas/gpu-dra-driver/pkg/timeslice"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"
)

// sharingNode: GPU 4 time-sliced 4 ways (interval Long), GPU 5 shared,
// GPU 6 two replicas with MPS, GPU 7 shared with MPS, shares up to 16Gi.
func sharingNode() *configapi.NodeConfig {
	return &configapi.NodeConfig{GPUs: []configapi.GpuModeSelector{
		{Indexes: []int{4}, GpuMode: configapi.GpuMode{TimeSlicing: &configapi.TimeSlicingMode{Replicas: 4, Interval: configapi.LongTimeSlice}}},
		{Indexes: []int{5}, GpuMode: configapi.GpuMode{Shared: &configapi.SharedMode{}}},
		{Indexes: []int{6}, GpuMode: configapi.GpuMode{TimeSlicing: &configapi.TimeSlicingMode{Replicas: 2, Strategy: configapi.MPSStrategy}}},
		{Indexes: []int{7}, GpuMode: configapi.GpuMode{Shared: &configapi.SharedMode{Strategy: configapi.MPSStrategy,
			Memory: configapi.SharedMemoryPolicy{Max: ptr.To(resource.MustParse("16Gi"))}}}},
	}}
}

// fakeRunner records driver-tool invocations instead of running them.
type fakeRunner struct {
	mu   sync.Mutex
	cmds []string
	fail map[string]error // by stdin or first arg
}

func (f *fakeRunner) Run(_ context.Context, c timeslice.Cmd) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	line := strings.Join(strings.Fields(filepath.Base(c.Path)+" "+strings.Join(c.Args, " ")+" "+c.Stdin), " ")
	f.cmds = append(f.cmds, line)
	for k, err := range f.fail {
		if strings.Contains(line, k) {
			return nil, err
		}
	}
	return daemonAnswers(c.Stdin), nil
}

// daemonAnswers is what a fresh MPS control daemon answers to the plugin's
// questions: 100% of the threads, no memory limit (nothing), no servers.
func daemonAnswers(stdin string) []byte {
	var out []string
	for _, line := range strings.Split(stdin, "\n") {
		if strings.TrimSpace(line) == "get_default_active_thread_percentage" {
			out = append(out, "100.0")
		}
	}
	return []byte(strings.Join(out, "\n"))
}

func (f *fakeRunner) take() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := f.cmds
	f.cmds = nil
	return out
}

// withTools gives the env a driver root holding nvidia-smi and the MPS
// control daemon, run by a fake runner.
func withTools(t *testing.T, e *testEnv) *fakeRunner {
	t.Helper()
	root := t.TempDir()
	bin := filepath.Join(root, "usr", "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{timeslice.NvidiaSMI, mps.ControlBinary} {
		if err := os.WriteFile(filepath.Join(bin, name), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	r := &fakeRunner{}
	e.Sharing = device.SharingOptions{DriverRoot: root, Runner: r, MPSDir: filepath.Join(t.TempDir(), "mps"), NVML: e.Lib}
	e.state = e.newState(t)
	return r
}

func (e *testEnv) device(name string) *device.AllocatableDevice {
	for i := range e.Devices {
		if e.Devices[i].Name() == name {
			return &e.Devices[i]
		}
	}
	return nil
}

func TestReplicaDevicesAndCapacities(t *testing.T) {
	e := newTestEnvWith(t, "dgxh100", sharingNode())
	if e.device("gpu-4") != nil || e.device("gpu-5") != nil {
		t.Error("a time-sliced or shared GPU is also offered whole")
	}
	gpu := e.Lib.GPUs()[4]
	for r := range 4 {
		d := e.device(fmt.Sprintf("gpu-4-ts-%d", r))
		if d == nil {
			t.Fatalf("replica %d missing", r)
		}
		a := d.API.Attributes
		if *a["type"].StringValue != "timeslice" || *a["replicas"].IntValue != 4 || *a["parentUUID"].StringValue != gpu.UUID ||
			*a["index"].IntValue != 4 || *a["productName"].StringValue != gpu.ProductName || a["cudaComputeCapability"].VersionValue == nil {
			t.Errorf("replica %d attributes %v", r, a)
		}
		if *a["sharingStrategy"].StringValue != "TimeSlicing" || *a["timeSliceInterval"].StringValue != "Long" {
			t.Errorf("replica %d does not publish its GPU's sharing settings: %v", r, a)
		}
		if mem := d.API.Capacity["memory"].Value; mem.Value() != int64(gpu.MemoryBytes/4) || mem.String() != "20Gi" {
			t.Errorf("replica memory = %s, want 20Gi", mem.String())
		}
		if d.MultiAllocatable() || d.API.Capacity["memory"].RequestPolicy != nil {
			t.Error("a replica is one claim's device")
		}
	}
	if e.device("gpu-4-ts-4") != nil || e.device("gpu-6-ts-1") == nil {
		t.Error("wrong replica count")
	}
}

func TestSharedDeviceShape(t *testing.T) {
	e := newTestEnvWith(t, "dgxh100", sharingNode())
	d := e.device("gpu-5-shared")
	if d == nil || d.Type() != device.TypeShared || !d.MultiAllocatable() {
		t.Fatalf("shared device = %+v", d)
	}
	if *d.API.Attributes["type"].StringValue != "shared" || *d.API.Attributes["parentUUID"].StringValue != e.GPUUUID(5) ||
		*d.API.Attributes["sharingStrategy"].StringValue != "TimeSlicing" {
		t.Errorf("attributes %v", d.API.Attributes)
	}
	if mps := e.device("gpu-7-shared").API.Attributes; *mps["sharingStrategy"].StringValue != "MPS" || mps["timeSliceInterval"].StringValue != nil {
		t.Errorf("MPS-shared GPU attributes %v", mps)
	}
	c := d.API.Capacity["memory"]
	p := c.RequestPolicy
	if c.Value.String() != "80Gi" || p == nil || p.ValidRange == nil || p.Default.String() != "1Gi" ||
		p.ValidRange.Min.String() != "1Gi" || p.ValidRange.Step.String() != "1Gi" || p.ValidRange.Max != nil {
		t.Errorf("memory capacity = %+v policy %+v", c, p)
	}
}

func TestSharedPolicyTooBigFallsBackToWhole(t *testing.T) {
	big := resource.MustParse("100Gi")
	cfg := &configapi.NodeConfig{GPUs: []configapi.GpuModeSelector{{Indexes: []int{5},
		GpuMode: configapi.GpuMode{Shared: &configapi.SharedMode{Memory: configapi.SharedMemoryPolicy{Min: &big}}}}}}
	e := newTestEnvWith(t, "dgxh100", cfg)
	if e.device("gpu-5-shared") != nil || e.device("gpu-5") == nil {
		t.Error("a policy larger than the GPU was published")
	}
}

// shareClaim is a claim holding a share of the shared GPU, as the
// scheduler records it.
func shareClaim(uid, memory string) *preparetest.ClaimBuilder {
	return shareOf("gpu-5-shared", uid, memory)
}

// mpsShareClaim is a claim holding a share of the MPS-shared GPU.
func mpsShareClaim(uid, memory string) *preparetest.ClaimBuilder {
	return shareOf("gpu-7-shared", uid, memory)
}

func shareOf(device, uid, memory string) *preparetest.ClaimBuilder {
	return preparetest.NewClaim(uid).Result(resourceapi.DeviceRequestAllocationResult{
		Request: "gpu", Driver: configapi.DriverName, Pool: testNode, Device: device,
		ShareID:          ptr.To(types.UID("share-" + uid)),
		ConsumedCapacity: map[resourceapi.QualifiedName]resource.Quantity{"memory": resource.MustParse(memory)},
	})
}

func TestSharedDeviceHeldByManyClaims(t *testing.T) {
	e := newTestEnvWith(t, "dgxh100", sharingNode())
	for _, uid := range []string{"a", "b", "c"} {
		devs, err := e.state.Prepare(e.Ctx, shareClaim(uid, "10Gi").Build())
		if err != nil {
			t.Fatalf("claim %s: %v", uid, err)
		}
		if devs[0].ShareID == nil || *devs[0].ShareID != types.UID("share-"+uid) {
			t.Errorf("claim %s: ShareID %v not returned", uid, devs[0].ShareID)
		}
	}
	if n, _ := e.state.env.Sharing.Holders(e.GPUUUID(5)); n != 3 {
		t.Errorf("holders = %d, want 3", n)
	}
	for _, uid := range []string{"a", "b", "c"} {
		if err := e.state.Unprepare(e.Ctx, types.UID(uid)); err != nil {
			t.Fatal(err)
		}
	}
	if n, _ := e.state.env.Sharing.Holders(e.GPUUUID(5)); n != 0 {
		t.Errorf("holders after unprepare = %d", n)
	}
}

func TestReplicasWithDefaultIntervalNeedNoTool(t *testing.T) {
	cfg := sharingNode()
	cfg.GPUs[0].TimeSlicing.Interval = ""
	e := newTestEnvWith(t, "dgxh100", cfg)
	for r := range 4 {
		if _, err := e.state.Prepare(e.Ctx, preparetest.NewClaim(fmt.Sprint(r)).Device("gpu", fmt.Sprintf("gpu-4-ts-%d", r)).Build()); err != nil {
			t.Fatalf("replica %d: %v", r, err)
		}
	}
	if _, err := e.state.Prepare(e.Ctx, preparetest.NewClaim("x").Device("gpu", "gpu-4-ts-0").Build()); err == nil ||
		!strings.Contains(err.Error(), "already prepared") {
		t.Errorf("a replica was prepared for two claims: %v", err)
	}
}

func TestClaimAskingForToolsWithoutThemFailsClearly(t *testing.T) {
	e := newTestEnvWith(t, "dgxh100", sharingNode())
	for name, tc := range map[string]struct {
		claim *resourceapi.ResourceClaim
		want  string
	}{
		"node interval Long": {preparetest.NewClaim("a").Device("gpu", "gpu-4-ts-0").Build(), "nvidia-smi: binary not found"},
		"MPS": {preparetest.NewClaim("b").Device("gpu", "gpu-6-ts-0").Config(resourceapi.AllocationConfigSourceClaim,
			`{"apiVersion":"gpu.gpuaas.io/v1alpha1","kind":"GpuConfig","sharing":{"strategy":"MPS"}}`).Build(), "nvidia-cuda-mps-control: binary not found"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := e.state.Prepare(e.Ctx, tc.claim)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
			if e.CDISpecExists(string(tc.claim.UID)) || e.RecordExists(string(tc.claim.UID)) {
				t.Error("failed prepare left files")
			}
		})
	}
}

func TestTimeSliceReferenceCountAcrossRestart(t *testing.T) {
	e := newTestEnvWith(t, "dgxh100", sharingNode())
	run := withTools(t, e)
	uuid := e.GPUUUID(4)
	a := preparetest.NewClaim("a").Device("gpu", "gpu-4-ts-0").Build()
	b := preparetest.NewClaim("b").Device("gpu", "gpu-4-ts-1").Build()
	for _, c := range []*resourceapi.ResourceClaim{a, b} {
		if _, err := e.state.Prepare(e.Ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	set := "nvidia-smi compute-policy -i " + uuid + " --set-timeslice=3"
	if got := run.take(); !slices.Equal(got, []string{set}) {
		t.Errorf("commands = %v, want one %q", got, set)
	}
	s := restartWith(t, e, a, b)
	if n, st := s.env.Sharing.Holders(uuid); n != 2 || st.Interval != configapi.LongTimeSlice {
		t.Fatalf("after restart: %d holders of %v", n, st)
	}
	if err := s.Unprepare(e.Ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if got := run.take(); len(got) != 0 {
		t.Errorf("reset while a claim still holds the GPU: %v", got)
	}
	if err := s.Unprepare(e.Ctx, "b"); err != nil {
		t.Fatal(err)
	}
	reset := "nvidia-smi compute-policy -i " + uuid + " --set-timeslice=0"
	if got := run.take(); !slices.Equal(got, []string{reset}) {
		t.Errorf("commands = %v, want %q", got, reset)
	}
}

func TestFailedResetKeepsClaimForRetry(t *testing.T) {
	e := newTestEnvWith(t, "dgxh100", sharingNode())
	run := withTools(t, e)
	if _, err := e.state.Prepare(e.Ctx, preparetest.NewClaim("a").Device("gpu", "gpu-4-ts-0").Build()); err != nil {
		t.Fatal(err)
	}
	run.fail = map[string]error{"--set-timeslice=0": fmt.Errorf("GPU busy")}
	if err := e.state.Unprepare(e.Ctx, "a"); err == nil || !e.RecordExists("a") {
		t.Fatalf("unprepare with a failing reset: %v; record kept %v", err, e.RecordExists("a"))
	}
	run.fail = nil
	if err := e.state.Unprepare(e.Ctx, "a"); err != nil || e.RecordExists("a") {
		t.Fatalf("retry: %v", err)
	}
}

func TestInterruptedPrepareResetsAtRestart(t *testing.T) {
	e := newTestEnvWith(t, "dgxh100", sharingNode())
	run := withTools(t, e)
	claim := preparetest.NewClaim("a").Device("gpu", "gpu-4-ts-0").Build()
	// Fail after the settings are applied: the CDI spec cannot be written.
	e.state.cdi = failingCDI{CDIWriter: e.state.cdi}
	if _, err := e.state.Prepare(e.Ctx, claim); err == nil {
		t.Fatal("prepare succeeded")
	}
	if got := run.take(); len(got) != 2 || !strings.HasSuffix(got[1], "--set-timeslice=0") {
		t.Errorf("rollback did not reset the interval: %v", got)
	}
}

type failingCDI struct{ CDIWriter }

func (failingCDI) WriteClaimSpec(string, []cdipkg.Device) (map[string]string, error) {
	return nil, fmt.Errorf("disk full")
}

// TestClaimsCannotChangeGPUSharing (item 10): sharing settings are the
// GPU's. A claim asking for other settings than its GPU's is refused with
// the attributes to select by; one restating them is prepared. Claims with
// no config on an MPS GPU join its daemon, so the first MPS claim no
// longer blocks every later claim on the GPU.
func TestClaimsCannotChangeGPUSharing(t *testing.T) {
	e := newTestEnvWith(t, "dgxh100", sharingNode())
	withTools(t, e)
	const head = `{"apiVersion":"gpu.gpuaas.io/v1alpha1","kind":"GpuConfig","sharing":`
	withConfig := func(uid, device, sharing string) *resourceapi.ResourceClaim {
		return preparetest.NewClaim(uid).Device("gpu", device).Config(resourceapi.AllocationConfigSourceClaim, head+sharing+`}`).Build()
	}
	for name, claim := range map[string]*resourceapi.ResourceClaim{
		"other interval":         withConfig("a", "gpu-4-ts-0", `{"strategy":"TimeSlicing","timeSlicingConfig":{"interval":"Short"}}`),
		"MPS on a time-sliced":   withConfig("b", "gpu-4-ts-0", `{"strategy":"MPS"}`),
		"time-slicing on an MPS": withConfig("c", "gpu-6-ts-0", `{"strategy":"TimeSlicing"}`),
	} {
		_, err := e.state.Prepare(e.Ctx, claim)
		if err == nil || !strings.Contains(err.Error(), "sharing settings are per GPU, select a GPU that has them (attributes sharingStrategy, timeSliceInterval)") {
			t.Errorf("%s: err = %v", name, err)
		}
	}
	for _, claim := range []*resourceapi.ResourceClaim{
		withConfig("d", "gpu-4-ts-1", `{"strategy":"TimeSlicing","timeSlicingConfig":{"interval":"Long"}}`),
		preparetest.NewClaim("e").Device("gpu", "gpu-4-ts-2").Build(),
		withConfig("f", "gpu-6-ts-0", `{"strategy":"MPS"}`),
		preparetest.NewClaim("g").Device("gpu", "gpu-6-ts-1").Build(),
	} {
		if _, err := e.state.Prepare(e.Ctx, claim); err != nil {
			t.Errorf("claim %s with its GPU's settings: %v", claim.UID, err)
		}
	}
	if n, set := e.state.env.Sharing.Holders(e.GPUUUID(6)); n != 2 || set.Strategy != configapi.MPSStrategy {
		t.Errorf("GPU 6: %d holders of %s, want 2 MPS clients", n, set)
	}
}

func TestMPSLimitsInCDISpec(t *testing.T) {
	e := newTestEnvWith(t, "dgxh100", sharingNode())
	run := withTools(t, e)
	uuid := e.GPUUUID(7)
	daemons := &mps.Daemons{Dir: e.Sharing.MPSDir}
	for _, uid := range []string{"a", "b"} {
		// An MPS GPU's claims need no config: the GPU's strategy applies.
		if _, err := e.state.Prepare(e.Ctx, mpsShareClaim(uid, "10Gi").Build()); err != nil {
			t.Fatal(err)
		}
	}
	data, err := os.ReadFile(cdipkg.SpecPath(e.CDIRoot, "a"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=" + uuid + "=10240M",
		"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=13", // 10Gi of 80Gi, rounded up
		"CUDA_MPS_PIPE_DIRECTORY=" + daemons.PipeDir(uuid),
		// ... and the pipe directory is mounted so the client reaches the daemon.
		`"hostPath":"` + daemons.PipeDir(uuid) + `","containerPath":"` + daemons.PipeDir(uuid) + `"`,
		// ... and clients and daemon exchange work through one /dev/shm.
		`"hostPath":"` + daemons.ShmDir(uuid) + `","containerPath":"/dev/shm"`,
	} {
		if !strings.Contains(string(data), want) {
			t.Errorf("spec lacks %s:\n%s", want, data)
		}
	}
	dev, _ := e.Lib.DeviceByUUID(uuid)
	if mode, _ := dev.GetComputeMode(); mode != nvml.COMPUTEMODE_EXCLUSIVE_PROCESS {
		t.Errorf("compute mode = %v while MPS runs", mode)
	}
	got := run.take()
	if len(got) < 2 || !strings.HasPrefix(got[0], "nvidia-cuda-mps-control -d") {
		t.Errorf("daemon not started once then checked: %v", got)
	}
	// The daemon holds limits too: a client that drops its environment
	// still gets no more than the largest share the node sells (16Gi).
	if !slices.Contains(got, "nvidia-cuda-mps-control set_default_active_thread_percentage 20 set_default_device_pinned_mem_limit 0 16384M") {
		t.Errorf("the daemon was not given the node configuration's limits: %v", got)
	}
	for _, uid := range []string{"a", "b"} {
		if err := e.state.Unprepare(e.Ctx, types.UID(uid)); err != nil {
			t.Fatal(err)
		}
	}
	if got := run.take(); !slices.Contains(got, "nvidia-cuda-mps-control quit") {
		t.Errorf("daemon not stopped: %v", got)
	}
	if mode, _ := dev.GetComputeMode(); mode != nvml.COMPUTEMODE_DEFAULT {
		t.Errorf("compute mode = %v after the last MPS claim", mode)
	}
}

func TestMPSConfigLimitsOnReplica(t *testing.T) {
	e := newTestEnvWith(t, "dgxh100", sharingNode())
	withTools(t, e)
	cfg := `{"apiVersion":"gpu.gpuaas.io/v1alpha1","kind":"GpuConfig","sharing":{"strategy":"MPS","mpsConfig":{"defaultActiveThreadPercentage":30,"defaultPinnedDeviceMemoryLimit":"16Gi"}}}`
	if _, err := e.state.Prepare(e.Ctx, preparetest.NewClaim("a").Device("gpu", "gpu-6-ts-0").Config(resourceapi.AllocationConfigSourceClaim, cfg).Build()); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(cdipkg.SpecPath(e.CDIRoot, "a"))
	if !strings.Contains(string(data), "=16384M") || !strings.Contains(string(data), "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30") {
		t.Errorf("config limits not in spec:\n%s", data)
	}
}

func TestClaimConfigErrors(t *testing.T) {
	e := newTestEnvWith(t, "dgxh100", sharingNode())
	withTools(t, e)
	const head = `{"apiVersion":"gpu.gpuaas.io/v1alpha1","kind":"GpuConfig","sharing":`
	for name, tc := range map[string]struct {
		claim *resourceapi.ResourceClaim
		want  string
	}{
		"Exclusive on a replica": {preparetest.NewClaim("a").Device("gpu", "gpu-4-ts-0").
			Config(resourceapi.AllocationConfigSourceClaim, head+`{"strategy":"Exclusive"}}`).Build(), "shares its GPU by design"},
		"limit above replica memory": {preparetest.NewClaim("b").Device("gpu", "gpu-6-ts-0").
			Config(resourceapi.AllocationConfigSourceClaim, head+`{"strategy":"MPS","mpsConfig":{"defaultPinnedDeviceMemoryLimit":"50Gi"}}}`).Build(), "mpsConfig.defaultPinnedDeviceMemoryLimit 50Gi is above the cap of"},
		"bad interval": {preparetest.NewClaim("c").Device("gpu", "gpu-0").
			Config(resourceapi.AllocationConfigSourceClaim, head+`{"strategy":"TimeSlicing","timeSlicingConfig":{"interval":"Eternal"}}}`).Build(), `unsupported value "Eternal"`},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := e.state.Prepare(e.Ctx, tc.claim)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
}

func TestWholeGPUTimeSlicingOnMultiPodClaim(t *testing.T) {
	e := newTestEnvWith(t, "dgxh100", sharingNode())
	run := withTools(t, e)
	cfg := `{"apiVersion":"gpu.gpuaas.io/v1alpha1","kind":"GpuConfig","sharing":{"strategy":"TimeSlicing","timeSlicingConfig":{"interval":"Medium"}}}`
	if _, err := e.state.Prepare(e.Ctx, preparetest.NewClaim("a").Device("gpu", "gpu-0").Config(resourceapi.AllocationConfigSourceClaim, cfg).Build()); err != nil {
		t.Fatal(err)
	}
	if got := run.take(); len(got) != 1 || !strings.HasSuffix(got[0], "--set-timeslice=2") {
		t.Errorf("commands %v", got)
	}
}

// BenchmarkPrepareUnprepareReplica: one time-slice replica claim (Default
// interval: no tool runs), prepare then unprepare.
func BenchmarkPrepareUnprepareReplica(b *testing.B) {
	cfg := sharingNode()
	cfg.GPUs[0].TimeSlicing.Interval = ""
	benchPrepareUnprepare(b, newTestEnvWith(b, "dgxh100", cfg), "gpu-4-ts-0")
}

// BenchmarkPrepareShareWithShares: one 1Gi share of the shared GPU with N
// other shares already prepared on the same device; the cost must not grow
// with N (reference counts are per GPU, the exclusivity check skips shares).
func BenchmarkPrepareShareWithShares(b *testing.B) {
	for _, n := range []int{10, 1000} {
		b.Run(fmt.Sprintf("shares=%d", n), func(b *testing.B) {
			e := newTestEnvWith(b, "dgxh100", sharingNode())
			for i := range n {
				if _, err := e.state.Prepare(e.Ctx, shareClaim(fmt.Sprintf("bg-%d", i), "1Gi").Build()); err != nil {
					b.Fatal(err)
				}
			}
			syscall.Sync() // the shares were prepared earlier, not during the measurement
			benchClaims(b, e, func(uid string) *resourceapi.ResourceClaim { return shareClaim(uid, "1Gi").Build() })
		})
	}
}

// TestBusyGPUKeepsItsSharingSettings: the node configuration turns the
// MPS GPU 6 into a time-sliced one while an MPS claim holds it; until it
// is idle it keeps MPS (its daemon serves that claim), and the replicas
// publish what is in force.
func TestBusyGPUKeepsItsSharingSettings(t *testing.T) {
	e := newTestEnvWith(t, "dgxh100", sharingNode())
	withTools(t, e)
	if _, err := e.state.Prepare(e.Ctx, preparetest.NewClaim("busy").Device("gpu", "gpu-6-ts-0").Build()); err != nil {
		t.Fatal(err)
	}
	records, _, _ := e.state.env.Store.LoadAll()
	changed := sharingNode()
	changed.GPUs[2].TimeSlicing = &configapi.TimeSlicingMode{Replicas: 2, Interval: configapi.ShortTimeSlice}
	changed.GPUs[0].TimeSlicing.Interval = configapi.MediumTimeSlice // GPU 4 is idle: changes
	logger := ktesting.NewLogger(t, ktesting.NewConfig())
	pinned, _ := device.PinModes(logger, changed, e.Lib.GPUs(), records)
	inv := inventory.Discover(logger, e.Lib, pinned)
	got := map[string]string{}
	for _, d := range inv.Devices {
		if k, ok := d.Kind.(interface{ GPUSettings() timeslice.Settings }); ok {
			got[d.Name()] = k.GPUSettings().String()
		}
	}
	if got["gpu-6-ts-1"] != "MPS" || got["gpu-4-ts-0"] != "TimeSlicing (interval Medium)" {
		t.Errorf("settings after the change: %v; want GPU 6 kept MPS while busy, GPU 4 changed", got)
	}
}

// A request whose MPS devices are on two GPUs is refused before anything
// changes: its containers would reach one GPU's daemon only. Two requests,
// one per GPU, may go to two containers and are prepared.
func TestMPSRequestOnTwoGPUsRefused(t *testing.T) {
	e := newTestEnvWith(t, "dgxh100", sharingNode())
	run := withTools(t, e)
	replica := func(req string) resourceapi.DeviceRequestAllocationResult {
		return resourceapi.DeviceRequestAllocationResult{Request: req, Driver: configapi.DriverName, Pool: testNode, Device: "gpu-6-ts-0"}
	}
	share := func(req string) resourceapi.DeviceRequestAllocationResult {
		return resourceapi.DeviceRequestAllocationResult{Request: req, Driver: configapi.DriverName, Pool: testNode, Device: "gpu-7-shared",
			ShareID: ptr.To(types.UID("share-x")), ConsumedCapacity: map[resourceapi.QualifiedName]resource.Quantity{"memory": resource.MustParse("10Gi")}}
	}
	_, err := e.state.Prepare(e.Ctx, preparetest.NewClaim("one-request").Result(replica("gpu")).Result(share("gpu")).Build())
	if err == nil || !strings.Contains(err.Error(), "MPS devices on 2 GPUs") {
		t.Fatalf("one request on two MPS GPUs: %v", err)
	}
	if got := run.take(); len(got) > 0 {
		t.Errorf("a refused claim ran driver tools: %v", got)
	}
	if _, err := e.state.Prepare(e.Ctx, preparetest.NewClaim("two-requests").Result(replica("a")).Result(share("b")).Build()); err != nil {
		t.Fatalf("two requests, one MPS GPU each: %v", err)
	}
}
