// Package preparetest is the fixture the tests of claim preparation and of
// the kubelet plugin share: a mock machine with the directories of a
// plugin (CDI specs, checkpoint, fake mig-minors and boot ID), allocated
// claims the way the scheduler leaves them, and what a scheduler
// benchmark needs. It does not import package prepare (whose own tests
// use it): each suite builds its State from an Env (NewCDIHandler,
// NewStore, NodeEvents).
package preparetest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/cdi"
	"github.com/gpuaas/gpu-dra-driver/pkg/mig"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/checkpoint"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/device"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/inventory"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/telemetry"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/klog/v2/ktesting"
)

// Node is the test node's name, and so its pool's.
const Node = "node-a"

// Env is a mock machine with a plugin's directories, so that a second
// State on the same directories plays the restarted plugin.
type Env struct {
	T       *testing.T
	Lib     nvdev.Interface
	CDIRoot string
	CkptDir string
	// MigMinors is a fake /proc/driver/nvidia-caps/mig-minors.
	MigMinors string
	Metrics   *telemetry.Metrics
	Devices   []device.AllocatableDevice
	// Inventory is what Devices were discovered in, for Restore.
	Inventory inventory.Inventory
	Ctx       context.Context
	// Sharing wires each (re)started State's sharing settings; the zero
	// value has no driver tools.
	Sharing device.SharingOptions
	// Machine is the mock machine's name; BootID a fake boot_id file.
	Machine string
	BootID  string
	// MockStateDir keeps the mock machine in a file when not empty, so that
	// a new backend on it plays the restarted process (ReopenMachine).
	MockStateDir string
	// DriverRoot and CDIHook, when set, give each new State's CDI handler
	// a driver's files and NVIDIA's hooks, as on a GPU node.
	DriverRoot, CDIHook string
	// CgroupV2 stands in for the host's cgroup version check of each new
	// State's CDI handler (cdi.Options.CgroupV2); nil asks the host.
	CgroupV2 func() (bool, string)
	// Events are the Node events of every State of the env.
	Events *EventLog
}

// EventLog records Node events as "<type> <reason> <note>".
type EventLog struct {
	mu     sync.Mutex
	Events []string
}

// Eventf implements events.EventRecorder.
func (l *EventLog) Eventf(_, _ runtime.Object, eventtype, reason, _, note string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.Events = append(l.Events, eventtype+" "+reason+" "+fmt.Sprintf(note, args...))
}

// WithReason returns the warnings recorded with a reason.
func (l *EventLog) WithReason(reason string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, e := range l.Events {
		if strings.HasPrefix(e, "Warning "+reason+" ") {
			out = append(out, e)
		}
	}
	return out
}

// Saw reports whether an event of a type and reason was recorded.
func (l *EventLog) Saw(eventType, reason string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range l.Events {
		if strings.HasPrefix(e, eventType+" "+reason+" ") {
			return true
		}
	}
	return false
}

// NewEnv opens the mock machine (kept in mockStateDir; empty keeps it in
// memory) with the devices cfg publishes, and the plugin's directories.
func NewEnv(t testing.TB, machine string, cfg *configapi.NodeConfig, mockStateDir string) *Env {
	t.Helper()
	lib, err := nvdev.Open(nvdev.Options{Backend: "mock:" + machine, MockSeed: Node, MockStateDir: mockStateDir})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	_, ctx := ktesting.NewTestContext(t)
	e := &Env{Lib: lib, CDIRoot: filepath.Join(dir, "cdi"), CkptDir: filepath.Join(dir, "claims"),
		MigMinors: filepath.Join(dir, "mig-minors"), Ctx: ctx, Machine: machine, BootID: filepath.Join(dir, "boot_id"),
		MockStateDir: mockStateDir, Events: &EventLog{}}
	if err := os.WriteFile(e.BootID, []byte("boot-1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if tt, ok := t.(*testing.T); ok {
		e.T = tt
	}
	// A fake /proc/devices beside the fake mig-minors: the CDI handler reads
	// the capability nodes' major there.
	if err := os.WriteFile(filepath.Join(dir, "devices"), []byte("Character devices:\n195 nvidia\n237 nvidia-caps\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	e.Inventory = inventory.Discover(ktesting.NewLogger(t, ktesting.NewConfig()), lib, cfg)
	e.Devices = e.Inventory.Devices
	return e
}

// NewCDIHandler is a CDI handler on the env's directories, as a
// (re)started plugin makes.
func (e *Env) NewCDIHandler(t testing.TB) *cdi.Handler {
	t.Helper()
	handler, err := cdi.NewHandler(cdi.Options{CDIRoot: e.CDIRoot, NVML: e.Lib.NVML(),
		DriverRoot: e.DriverRoot, CDIHookPath: e.CDIHook, CgroupV2: e.CgroupV2,
		ProcDevicesPath: filepath.Join(filepath.Dir(e.MigMinors), "devices")})
	if err != nil {
		t.Fatal(err)
	}
	return handler
}

// NewStore is the checkpoint on the env's directory.
func (e *Env) NewStore(t testing.TB) *checkpoint.Store {
	t.Helper()
	store, err := checkpoint.NewStore(e.CkptDir)
	if err != nil {
		t.Fatal(err)
	}
	return store
}

// NodeEvents records the Node events of a State in Events.
func (e *Env) NodeEvents() telemetry.NodeEvents {
	return telemetry.NewNodeEvents(context.Background(), e.Events, nil, Node)
}

// FileExists reports whether path exists.
func FileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// CDISpecExists reports whether a claim's CDI spec exists.
func (e *Env) CDISpecExists(uid string) bool { return FileExists(cdi.SpecPath(e.CDIRoot, uid)) }

// RecordExists reports whether a claim's checkpoint record exists.
func (e *Env) RecordExists(uid string) bool {
	return FileExists(filepath.Join(e.CkptDir, uid+".json"))
}

// GPUUUID is the UUID of the GPU at index.
func (e *Env) GPUUUID(index int) string { return e.Lib.GPUs()[index].UUID }

// GPUDev is the NVML device of the GPU at index.
func (e *Env) GPUDev(t *testing.T, index int) nvml.Device {
	t.Helper()
	dev, ret := e.Lib.NVML().DeviceGetHandleByUUID(e.Lib.GPUs()[index].UUID)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	return dev
}

// ReopenMachine plays the plugin process's death and a new one's start:
// the old backend is abandoned (never shut down) and a new one opened on
// the same mock state directory, with the devices it publishes.
func (e *Env) ReopenMachine(t *testing.T, cfg *configapi.NodeConfig) {
	t.Helper()
	e.OpenMachine(t, cfg, e.MockStateDir)
}

// OpenMachine opens a new backend of the env's machine kept in
// mockStateDir (empty: a fresh one in memory, as after a reboot), with
// the devices it publishes, in place of the env's.
func (e *Env) OpenMachine(t *testing.T, cfg *configapi.NodeConfig, mockStateDir string) {
	t.Helper()
	lib, err := nvdev.Open(nvdev.Options{Backend: "mock:" + e.Machine, MockSeed: Node, MockStateDir: mockStateDir})
	if err != nil {
		t.Fatal(err)
	}
	e.Lib = lib
	if e.Sharing.NVML != nil {
		e.Sharing.NVML = lib
	}
	e.Inventory = inventory.Discover(ktesting.NewLogger(t, ktesting.NewConfig()), lib, cfg)
	e.Devices = e.Inventory.Devices
}

// MIGDevices are the MIG devices that exist now on the GPU at gpuIndex.
func (e *Env) MIGDevices(t *testing.T, gpuIndex int) []mig.Instance {
	t.Helper()
	dev, err := e.Lib.DeviceByUUID(e.Lib.GPUs()[gpuIndex].UUID)
	if err != nil {
		t.Fatal(err)
	}
	insts, err := mig.List(dev)
	if err != nil {
		t.Fatal(err)
	}
	return insts
}

// Partition returns the name of the first published partition of a
// profile on a GPU.
func (e *Env) Partition(t *testing.T, gpuIndex int, profile string) string {
	t.Helper()
	for _, d := range e.Devices {
		if d.Partition() != nil && d.GPU.Index == gpuIndex && d.Partition().Profile.Name == profile {
			return d.Name()
		}
	}
	t.Fatalf("no %s partition on GPU %d", profile, gpuIndex)
	return ""
}

// PartitionAt is the dynamic device of a profile at a memory slice.
func (e *Env) PartitionAt(t *testing.T, index int, profile string, start int) *device.AllocatableDevice {
	t.Helper()
	for i, d := range e.Devices {
		if p := d.Partition(); p != nil && d.GPU.Index == index && p.Profile.Name == profile && p.Placement.Start == start {
			return &e.Devices[i]
		}
	}
	t.Fatalf("no %s at memory slice %d on GPU %d", profile, start, index)
	return nil
}

// MakeUnitModes makes GPU 1's static MIG layout (3g + 2g + 1g + 1g, as an
// admin would) and returns the node configuration that offers GPU 0 as
// dynamic MIG, 1 as static MIG, 2 as 3 time-slice replicas, 3 shared, the
// others whole.
func (e *Env) MakeUnitModes(t *testing.T, units *bool) *configapi.NodeConfig {
	t.Helper()
	dev, err := e.Lib.DeviceByUUID(e.Lib.GPUs()[1].UUID)
	if err != nil {
		t.Fatal(err)
	}
	if err := mig.EnableMigMode(dev); err != nil {
		t.Fatal(err)
	}
	if _, err := mig.ApplyLayout(dev, []string{"3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"}); err != nil {
		t.Fatal(err)
	}
	e.Lib.GPUs()[1].MigEnabled = true // as the admin's change reports after a re-open
	return &configapi.NodeConfig{GPUUnitCounters: units, GPUs: []configapi.GpuModeSelector{
		{Indexes: []int{0}, GpuMode: configapi.GpuMode{MIG: configapi.MigDynamic}},
		{Indexes: []int{1}, GpuMode: configapi.GpuMode{MIG: configapi.MigStatic}},
		{Indexes: []int{2}, GpuMode: configapi.GpuMode{TimeSlicing: &configapi.TimeSlicingMode{Replicas: 3}}},
		{Indexes: []int{3}, GpuMode: configapi.GpuMode{Shared: &configapi.SharedMode{}}},
	}}
}
