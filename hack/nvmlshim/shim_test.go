package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/gpuaas/gpu-dra-driver/hack/nvmlshim/shimbuild"
	"github.com/gpuaas/gpu-dra-driver/pkg/mig"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev/nvmock"
)

// The tests here build the library (cached under _output/nvml/cache by a
// hash of its sources) and nvmlprobe, put the library in a temporary
// driver root as libnvidia-ml.so.1, and run nvmlprobe on it: the library
// is dlopened by a process that defines no NVML symbols itself (this test
// binary does: it is the library's package), and what it reads through
// go-nvml and pkg/nvdev's real backend is compared with what nvmock
// answers in this process for the same machine and state directory.

const testSeed = "node-a"

var built struct {
	once       sync.Once
	lib, probe string
	err        error
	took       time.Duration
}

// repoRoot is the module's directory.
func repoRoot(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatalf("go env GOMOD: %v", err)
	}
	return filepath.Dir(strings.TrimSpace(string(out)))
}

// buildLibrary builds the library (cached) and the probe once per test
// binary.
func buildLibrary(t *testing.T) (lib, probe string) {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the simulated NVML library (minutes cold)")
	}
	root := repoRoot(t)
	built.once.Do(func() {
		if built.lib, built.took, built.err = shimbuild.Library(root); built.err != nil {
			return
		}
		built.probe = filepath.Join(filepath.Dir(built.lib), "nvmlprobe")
		built.err = shimbuild.Go(root, "build", "-o", built.probe, "./hack/nvmlshim/nvmlprobe")
	})
	if built.err != nil {
		t.Fatalf("building the simulated NVML library: %v", built.err)
	}
	if built.took > 0 {
		t.Logf("built %s in %s", built.lib, built.took.Round(time.Second))
		built.took = 0
	}
	return built.lib, built.probe
}

// node is a driver root holding the library and a mock state directory.
type node struct {
	t                  *testing.T
	root, state, probe string
}

func newNode(t *testing.T) *node {
	lib, probe := buildLibrary(t)
	dir := t.TempDir()
	root := filepath.Join(dir, "driver")
	if err := os.MkdirAll(filepath.Join(root, "usr", "lib64"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(lib, filepath.Join(root, "usr", "lib64", "libnvidia-ml.so.1")); err != nil {
		t.Fatal(err)
	}
	return &node{t: t, root: root, state: filepath.Join(dir, "state"), probe: probe}
}

func (n *node) command(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, n.probe, append([]string{"--driver-root", n.root}, args...)...)
	cmd.Env = append(os.Environ(), envStateDir+"="+n.state, envSeed+"="+testSeed, envMachine+"=dgxh100", envTrace+"=1")
	return cmd
}

// run runs the probe and decodes its last line of output into out.
func (n *node) run(out any, args ...string) {
	n.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := n.command(ctx, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		n.t.Fatalf("nvmlprobe %v: %v\n%s", args, err, stderr.String())
	}
	if s := stderr.String(); s != "" {
		n.t.Logf("nvmlprobe %v stderr:\n%s", args, s)
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), out); err != nil {
		n.t.Fatalf("nvmlprobe %v: decoding %q: %v", args, stdout.String(), err)
	}
}

// mockInventory is what the in-process mock answers for the same machine.
func (n *node) mockInventory() ([]nvdev.GPU, nvdev.SystemInfo, map[string][]string) {
	n.t.Helper()
	lib, err := nvdev.Open(nvdev.Options{Backend: nvmock.Prefix + "dgxh100", MockSeed: testSeed, MockStateDir: n.state})
	if err != nil {
		n.t.Fatal(err)
	}
	defer func() { _ = lib.Shutdown() }()
	profiles := map[string][]string{}
	for _, g := range lib.GPUs() {
		dev, err := lib.DeviceByUUID(g.UUID)
		if err != nil {
			n.t.Fatal(err)
		}
		ps, err := mig.Profiles(dev)
		if err != nil {
			n.t.Fatal(err)
		}
		for _, p := range ps {
			profiles[g.UUID] = append(profiles[g.UUID], fmt.Sprintf("%s@%v", p.Name, p.Placements))
		}
	}
	return lib.GPUs(), lib.System(), profiles
}

type inventory struct {
	System   nvdev.SystemInfo    `json:"system"`
	GPUs     []nvdev.GPU         `json:"gpus"`
	Problems []string            `json:"problems"`
	Profiles map[string][]string `json:"profiles"`
}

func TestLibraryReadsTheMockMachine(t *testing.T) {
	n := newNode(t)
	var got inventory
	n.run(&got, "inventory")
	gpus, sys, profiles := n.mockInventory()
	if got.System != sys {
		t.Errorf("system: library %+v, mock %+v", got.System, sys)
	}
	if len(got.Problems) > 0 {
		t.Errorf("problems through the library: %v", got.Problems)
	}
	if len(got.GPUs) != 8 || len(got.GPUs) != len(gpus) {
		t.Fatalf("library read %d GPUs, mock has %d", len(got.GPUs), len(gpus))
	}
	for i, g := range got.GPUs {
		want := gpus[i]
		// The real backend reads the PCIe root from sysfs, which has no
		// simulated GPUs; the mock backend derives one.
		want.PCIeRoot = ""
		if g != want {
			t.Errorf("GPU %d:\nlibrary %+v\nmock    %+v", i, g, want)
		}
		if fmt.Sprint(got.Profiles[g.UUID]) != fmt.Sprint(profiles[g.UUID]) {
			t.Errorf("GPU %d MIG profiles:\nlibrary %v\nmock    %v", i, got.Profiles[g.UUID], profiles[g.UUID])
		}
	}
}

// TestLibraryGPUsAreBareMetal: every GPU of the simulated machine answers
// NVML_GPU_VIRTUALIZATION_MODE_NONE; NVIDIA's plugin with its DynamicMIG
// gate stops at start when the call fails.
func TestLibraryGPUsAreBareMetal(t *testing.T) {
	n := newNode(t)
	for gpu := range 8 {
		var mode int
		n.run(&mode, "virtualization-mode", "-gpu", strconv.Itoa(gpu))
		if mode != int(nvml.GPU_VIRTUALIZATION_MODE_NONE) {
			t.Errorf("GPU %d: virtualization mode %d, want NONE (%d)", gpu, mode, nvml.GPU_VIRTUALIZATION_MODE_NONE)
		}
	}
}

func TestLibraryMIGDevicesOutliveAKilledProcess(t *testing.T) {
	n := newNode(t)
	var first mig.Instance
	n.run(&first, "mig-create", "--gpu", "2", "--profile", "1g.10gb")
	if first.Profile != "1g.10gb" || !strings.HasPrefix(first.UUID, "MIG-") {
		t.Fatalf("created %+v", first)
	}

	// A process killed while it holds the library (and the mock driver)
	// open: what it made stays, as on a GPU.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := n.command(ctx, "mig-create", "--gpu", "2", "--profile", "3g.40gb", "--hold")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line := make([]byte, 4096)
	k, err := stdout.Read(line)
	if err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	var held mig.Instance
	if err := json.Unmarshal(bytes.TrimSpace(line[:k]), &held); err != nil {
		t.Fatalf("held instance %q: %v", line[:k], err)
	}
	_ = cmd.Process.Kill() // SIGKILL
	_ = cmd.Wait()

	var after []mig.Instance
	n.run(&after, "mig-list", "--gpu", "2")
	if len(after) != 2 || after[0] != first || after[1] != held {
		t.Fatalf("after SIGKILL: %+v, want %+v and %+v", after, first, held)
	}
	// The in-process mock on the same state directory sees them too.
	lib, err := nvdev.Open(nvdev.Options{Backend: nvmock.Prefix + "dgxh100", MockSeed: testSeed, MockStateDir: n.state})
	if err != nil {
		t.Fatal(err)
	}
	dev, err := lib.DeviceByUUID(lib.GPUs()[2].UUID)
	if err != nil {
		t.Fatal(err)
	}
	mocked, err := mig.List(dev)
	_ = lib.Shutdown()
	if err != nil || fmt.Sprint(mocked) != fmt.Sprint(after) {
		t.Fatalf("mock lists %+v (%v), library %+v", mocked, err, after)
	}

	for _, in := range after {
		var gone mig.Instance
		n.run(&gone, "mig-destroy", "--gpu", "2", "--gi", fmt.Sprint(in.GIID), "--ci", fmt.Sprint(in.CIID))
	}
	var none []mig.Instance
	n.run(&none, "mig-list", "--gpu", "2")
	if len(none) != 0 {
		t.Fatalf("after destroying: %+v", none)
	}
}

func TestLibraryDeliversInjectedXID(t *testing.T) {
	n := newNode(t)
	var inv inventory
	n.run(&inv, "inventory") // makes the state directory
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := n.command(ctx, "wait-event", "--gpu", "3", "--timeout", "20s")
	var stdout bytes.Buffer
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = io.MultiWriter(&stdout, pw), os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	registered := make([]byte, 64)
	if _, err := pr.Read(registered); err != nil {
		t.Fatal(err)
	}
	go func() { _, _ = io.Copy(io.Discard, pr) }()
	// What hack/mocknvml xid does.
	if err := nvmock.InjectEvent(n.state, "3", nvml.EventTypeXidCriticalError, 48, nvmock.WholeGPU, nvmock.WholeGPU); err != nil {
		t.Fatal(err)
	}
	err := cmd.Wait()
	_ = pw.Close()
	if err != nil {
		t.Fatalf("wait-event: %v\n%s", err, stdout.String())
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	var ev struct {
		UUID      string `json:"uuid"`
		EventType uint64 `json:"eventType"`
		Data      uint64 `json:"data"`
		GI, CI    uint32
	}
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &ev); err != nil {
		t.Fatal(err)
	}
	if ev.UUID != inv.GPUs[3].UUID || ev.EventType != nvml.EventTypeXidCriticalError || ev.Data != 48 || ev.GI != nvmock.WholeGPU {
		t.Fatalf("event %+v, want XID 48 on %s", ev, inv.GPUs[3].UUID)
	}
}

// TestLibraryKeepsTheHostPreemptible: a goroutine of the host spinning
// without calls stops only at an asynchronous preemption (SIGURG), so a
// garbage collection of the host finishes only if the host's SIGURGs still
// reach the host's runtime once the library's runtime has installed its
// handler. Without the chain (signals.go) the collection hangs for good.
func TestLibraryKeepsTheHostPreemptible(t *testing.T) {
	n := newNode(t)
	for _, chained := range []bool{true, false} {
		limit := 30 * time.Second
		if !chained {
			limit = 5 * time.Second // it hangs: killed then
		}
		ctx, cancel := context.WithTimeout(context.Background(), limit)
		cmd := n.command(ctx, "gc", "--timeout", "10s")
		if !chained {
			cmd.Env = append(cmd.Env, "GPUAAS_NVMLSHIM_NO_SIGURG_CHAIN=1")
		}
		out, err := cmd.CombinedOutput()
		cancel()
		switch {
		case chained && err != nil:
			t.Fatalf("with the SIGURG chain the host's collection did not finish: %v\n%s", err, out)
		case !chained && err == nil:
			t.Logf("without the chain the collection finished anyway (a SIGURG may reach the host while it is in a call of its own)")
		case !chained:
			t.Logf("without the chain: %v (as expected: the host's preemption signals are swallowed)", err)
		}
	}
}

// probeUse is nvmlprobe's use report (nvmlprobe/use.go).
type probeUse struct {
	Utilization    nvml.Utilization                `json:"utilization"`
	UtilizationRet nvml.Return                     `json:"utilizationRet"`
	Memory         nvml.Memory_v2                  `json:"memory"`
	MemoryRet      nvml.Return                     `json:"memoryRet"`
	Processes      []nvml.ProcessInfo              `json:"processes"`
	ProcessesRet   nvml.Return                     `json:"processesRet"`
	Samples        []nvml.ProcessUtilizationSample `json:"samples"`
	SamplesRet     nvml.Return                     `json:"samplesRet"`
	GPMSupported   uint32                          `json:"gpmSupported"`
	GPMSupportRet  nvml.Return                     `json:"gpmSupportRet"`
	SMActivity     float64                         `json:"smActivity"`
	SMActivityRet  nvml.Return                     `json:"smActivityRet"`
}

// TestLibraryServesUse: the use set on the machine from outside (what
// hack/mocknvml use and proc do) is what go-nvml reads through the
// library, for a whole GPU, a MIG device (GPM through the parent), a GPU
// whose use calls are switched off, and after a process ended.
func TestLibraryServesUse(t *testing.T) {
	n := newNode(t)
	var inv inventory
	n.run(&inv, "inventory") // makes the state directory
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	const mib = uint64(1) << 20
	must(nvmock.SetGPUUse(n.state, "1", nvmock.GPUUse{SMUtil: 70, MemUtil: 30, MemoryUsed: 1024 * mib}))
	must(nvmock.SetProcessUse(n.state, "1", nvmock.ProcessUse{PID: 4242, SMUtil: 70, MemUtil: 30, MemoryUsed: 512 * mib}))
	must(nvmock.SetProcessUse(n.state, "1", nvmock.ProcessUse{PID: 4243, MemoryUsed: 128 * mib}))

	var whole probeUse
	n.run(&whole, "use", "--gpu", "1")
	if whole.UtilizationRet != nvml.SUCCESS || whole.Utilization != (nvml.Utilization{Gpu: 70, Memory: 30}) {
		t.Errorf("utilization %+v, %v; want 70%%, 30%%", whole.Utilization, whole.UtilizationRet)
	}
	total := inv.GPUs[1].MemoryBytes
	if whole.MemoryRet != nvml.SUCCESS || whole.Memory.Used != 1024*mib || whole.Memory.Free != total-1024*mib || whole.Memory.Total != total {
		t.Errorf("memory %+v, %v; want 1 GiB of %d used", whole.Memory, whole.MemoryRet, total)
	}
	wantProcs := []nvml.ProcessInfo{
		{Pid: 4242, UsedGpuMemory: 512 * mib, GpuInstanceId: nvmock.WholeGPU, ComputeInstanceId: nvmock.WholeGPU},
		{Pid: 4243, UsedGpuMemory: 128 * mib, GpuInstanceId: nvmock.WholeGPU, ComputeInstanceId: nvmock.WholeGPU},
	}
	if whole.ProcessesRet != nvml.SUCCESS || fmt.Sprint(whole.Processes) != fmt.Sprint(wantProcs) {
		t.Errorf("processes %+v, %v\nwant %+v", whole.Processes, whole.ProcessesRet, wantProcs)
	}
	if whole.SamplesRet != nvml.SUCCESS || len(whole.Samples) != 1 || whole.Samples[0].Pid != 4242 || whole.Samples[0].SmUtil != 70 || whole.Samples[0].MemUtil != 30 {
		t.Errorf("process samples %+v, %v; want pid 4242's only", whole.Samples, whole.SamplesRet)
	}
	if whole.GPMSupported != 1 || whole.SMActivityRet != nvml.SUCCESS || math.Abs(whole.SMActivity-70) > 1e-6 {
		t.Errorf("GPM: supported %d (%v), SM activity %v (%v); want 70", whole.GPMSupported, whole.GPMSupportRet, whole.SMActivity, whole.SMActivityRet)
	}

	var made mig.Instance
	n.run(&made, "mig-create", "--gpu", "2", "--profile", "3g.40gb")
	must(nvmock.SetMIGUse(n.state, made.UUID, nvmock.MIGUse{SMActivity: 55, MemoryUsed: 2048 * mib}))
	must(nvmock.SetProcessUse(n.state, made.UUID, nvmock.ProcessUse{PID: 77, MemoryUsed: 256 * mib}))
	var inMIG probeUse
	n.run(&inMIG, "use", "--mig", made.UUID)
	if inMIG.UtilizationRet != nvml.ERROR_NOT_SUPPORTED || inMIG.SamplesRet != nvml.ERROR_NOT_SUPPORTED {
		t.Errorf("MIG device: utilization %v, process samples %v; want both NOT_SUPPORTED", inMIG.UtilizationRet, inMIG.SamplesRet)
	}
	if inMIG.MemoryRet != nvml.SUCCESS || inMIG.Memory.Used != 2048*mib || inMIG.Memory.Free != inMIG.Memory.Total-2048*mib {
		t.Errorf("MIG device memory %+v, %v; want 2 GiB used", inMIG.Memory, inMIG.MemoryRet)
	}
	wantMIG := []nvml.ProcessInfo{{Pid: 77, UsedGpuMemory: 256 * mib, GpuInstanceId: uint32(made.GIID), ComputeInstanceId: uint32(made.CIID)}}
	if inMIG.ProcessesRet != nvml.SUCCESS || fmt.Sprint(inMIG.Processes) != fmt.Sprint(wantMIG) {
		t.Errorf("MIG device processes %+v, %v; want %+v", inMIG.Processes, inMIG.ProcessesRet, wantMIG)
	}
	if inMIG.SMActivityRet != nvml.SUCCESS || math.Abs(inMIG.SMActivity-55) > 1e-6 {
		t.Errorf("MIG device SM activity %v (%v), want 55", inMIG.SMActivity, inMIG.SMActivityRet)
	}

	must(nvmock.SetUseSupported(n.state, "3", false))
	var off probeUse
	n.run(&off, "use", "--gpu", "3")
	if off.UtilizationRet != nvml.ERROR_NOT_SUPPORTED || off.MemoryRet != nvml.ERROR_NOT_SUPPORTED ||
		off.SamplesRet != nvml.ERROR_NOT_SUPPORTED || off.GPMSupported != 0 || off.SMActivityRet != nvml.ERROR_NOT_SUPPORTED {
		t.Errorf("use calls switched off: %+v; want NOT_SUPPORTED and GPM unsupported", off)
	}

	must(nvmock.EndProcess(n.state, 4242))
	var ended probeUse
	n.run(&ended, "use", "--gpu", "1")
	if fmt.Sprint(ended.Processes) != fmt.Sprint(wantProcs[1:]) || ended.SamplesRet != nvml.ERROR_NOT_FOUND {
		t.Errorf("after pid 4242 ended: processes %+v, samples %+v (%v); want pid 4243 only and ERROR_NOT_FOUND",
			ended.Processes, ended.Samples, ended.SamplesRet)
	}
}

// TestStubsAreCurrent: zz_stubs.c defines exactly what nvml.h declares
// and the Go files do not export.
func TestStubsAreCurrent(t *testing.T) {
	if out, err := exec.Command("go", "run", "./genstubs", "-check").CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
}
