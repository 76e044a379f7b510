package prepare

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/device"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/telemetry"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/cdi"
	"github.com/gpuaas/gpu-dra-driver/pkg/mig"
	"github.com/gpuaas/gpu-dra-driver/pkg/mps"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/checkpoint"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/prepare/preparetest"
	"github.com/gpuaas/gpu-dra-driver/pkg/timeslice"
	"github.com/prometheus/client_golang/prometheus"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
)

// crashCycles is how many claims the crash test prepares and unprepares.
const crashCycles = 200

// crashNode has every device kind on a DGX H100: GPU 0 whole, 1 and 2
// dynamic MIG, 3 static MIG, 4 replicas with interval Long (nvidia-smi
// runs), 5 shared, 6 replicas with MPS.
func crashNode() *configapi.NodeConfig {
	return &configapi.NodeConfig{GPUs: []configapi.GpuModeSelector{
		{Indexes: []int{1, 2}, GpuMode: configapi.GpuMode{MIG: configapi.MigDynamic}},
		{Indexes: []int{3}, GpuMode: configapi.GpuMode{MIG: configapi.MigStatic}},
		{Indexes: []int{4}, GpuMode: configapi.GpuMode{TimeSlicing: &configapi.TimeSlicingMode{Replicas: 4, Interval: configapi.LongTimeSlice}}},
		{Indexes: []int{5}, GpuMode: configapi.GpuMode{Shared: &configapi.SharedMode{}}},
		{Indexes: []int{6}, GpuMode: configapi.GpuMode{TimeSlicing: &configapi.TimeSlicingMode{Replicas: 2, Strategy: configapi.MPSStrategy}}},
	}}
}

// crashHarness plays the kubelet against a plugin that is killed at random
// points: every NVML change (before and after it reaches the machine),
// every CDI spec write and delete, every driver-tool call. A kill is a
// panic that abandons the State mid-call; the restart is a new process: a
// new backend on the same persistent mock machine, a new State on the same
// checkpoint, CDI and lock directories, and its Restore.
type crashHarness struct {
	t     *testing.T
	e     *testEnv
	rng   *rand.Rand
	tools *fakeTools
	state *State
	// countdown kills the plugin at the countdown-th fault point; 0 is
	// disarmed.
	countdown int
	// api holds the claims that exist in the API server, live those the
	// kubelet has prepared.
	api, live map[types.UID]*resourceapi.ResourceClaim
	static    []mig.Instance
	stats     crashStats
	// Set by variants (crashfaults_test.go): tune adjusts each new State;
	// retryable says whether a prepare's error is one the kubelet retries
	// (having fixed its cause); prepared checks a prepared claim.
	tune      func(*State)
	retryable func(error) bool
	prepared  func(*resourceapi.ResourceClaim)
	// extraKinds are device kinds claimed besides the usual ones.
	extraKinds []string
}

type crashStats struct {
	cycles, points, kills, restarts, deletedWhileDown int
	prepared                                          map[string]int
}

func (h *crashHarness) fault() {
	h.stats.points++
	if h.countdown == 0 {
		return
	}
	h.countdown--
	if h.countdown == 0 {
		h.stats.kills++
		panic(errKilled)
	}
}

// arm schedules a kill within the next calls; a prepare or unprepare has
// up to about a dozen fault points, so some arms fire in a later call or
// in a restart's Restore.
func (h *crashHarness) arm() { h.countdown = 1 + h.rng.IntN(14) }

// Issue 11: the plugin is killed at random points of crashCycles
// prepare/unprepare cycles over every device kind and restarted as the
// kubelet would; at the end nothing leaks: no CDI spec, no checkpoint
// record, no MIG device, no MPS daemon, compute mode or time-slice
// interval that no claim holds, and the static MIG layout is untouched.
func TestCrashPreparesLeakNothing(t *testing.T) {
	start := time.Now()
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("CRASH_TEST_SEED"); v != "" { // to replay a failure
		var err error
		if seed, err = strconv.ParseUint(v, 10, 64); err != nil {
			t.Fatalf("CRASH_TEST_SEED: %v", err)
		}
	}
	t.Logf("crash test seed %d (CRASH_TEST_SEED replays it)", seed)
	h := newCrashHarness(t, rand.New(rand.NewPCG(seed, 0)))
	for h.stats.cycles < crashCycles {
		h.step()
	}
	for uid := range h.live {
		h.kubeletUnprepare(uid)
	}
	h.countdown = 0
	h.restart()
	leaks := h.leaks()
	t.Logf("crash test: %d cycles (%v prepared by kind), %d kills at %d fault points, %d restarts, %d claims deleted while the plugin was down; leaks: %s; %s",
		h.stats.cycles, h.stats.prepared, h.stats.kills, h.stats.points, h.stats.restarts, h.stats.deletedWhileDown, leaks, time.Since(start).Round(time.Millisecond))
	if leaks.total() != 0 {
		t.Errorf("leaks: %s", leaks)
	}
	if h.stats.kills < crashCycles/4 { // about one per two cycles is usual
		t.Errorf("only %d kills in %d cycles", h.stats.kills, h.stats.cycles)
	}
}

func newCrashHarness(t *testing.T, rng *rand.Rand) *crashHarness {
	stateDir := t.TempDir()
	h := &crashHarness{t: t, rng: rng, api: map[types.UID]*resourceapi.ResourceClaim{},
		live: map[types.UID]*resourceapi.ResourceClaim{}, stats: crashStats{prepared: map[string]int{}}}
	h.static = layOutStaticMIG(t, stateDir, 3)
	h.e = newTestEnvIn(t, "dgxh100", crashNode(), stateDir)
	h.tools = newFakeTools(t, h.fault)
	h.e.Sharing = device.SharingOptions{DriverRoot: h.tools.root, Runner: h.tools, MPSDir: filepath.Join(t.TempDir(), "mps"), NVML: h.e.Lib}
	h.e.wrapCDI = func(w CDIWriter) CDIWriter { return &faultyCDI{CDIWriter: w, fault: h.fault} }
	h.e.Metrics = telemetry.NewMetrics(prometheus.NewRegistry())
	h.hookMachine()
	h.state = h.e.newState(t)
	restore(t, h.e, h.state)
	return h
}

// layOutStaticMIG makes MIG devices on a GPU before the plugin starts, as
// an admin (or mig-parted) would.
func layOutStaticMIG(t *testing.T, stateDir string, index int) []mig.Instance {
	lib, err := nvdev.Open(nvdev.Options{Backend: "mock:dgxh100", MockSeed: testNode, MockStateDir: stateDir})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lib.Shutdown() }()
	dev, err := lib.DeviceByUUID(lib.GPUs()[index].UUID)
	if err != nil {
		t.Fatal(err)
	}
	if err := mig.EnableMigMode(dev); err != nil {
		t.Fatal(err)
	}
	profiles, err := mig.Profiles(dev)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range []struct {
		profile string
		start   int
	}{{"3g.40gb", 4}, {"2g.20gb", 0}, {"1g.10gb", 2}, {"1g.10gb", 3}} {
		p, _ := mig.ProfileByName(profiles, l.profile)
		if _, err := mig.Create(dev, p, mig.Placement{Start: l.start, Size: p.MemorySlices}); err != nil {
			t.Fatal(err)
		}
	}
	insts, err := mig.List(dev)
	if err != nil {
		t.Fatal(err)
	}
	return insts
}

// step prepares a new claim or unprepares a prepared one.
func (h *crashHarness) step() {
	if len(h.live) > 0 && (len(h.live) >= 3 || h.rng.IntN(2) == 0) {
		uids := make([]types.UID, 0, len(h.live))
		for uid := range h.live {
			uids = append(uids, uid)
		}
		slices.Sort(uids)
		h.kubeletUnprepare(uids[h.rng.IntN(len(uids))])
		return
	}
	claim, kind := h.newClaim(types.UID(fmt.Sprintf("c%d", h.stats.cycles)))
	h.stats.cycles++
	h.stats.prepared[kind]++
	h.api[claim.UID] = claim
	if h.rng.IntN(4) != 0 {
		h.arm()
	}
	h.kubeletPrepare(claim)
}

// kubeletPrepare prepares until it succeeds, restarting the plugin after
// each kill; sometimes the pod and its claim are deleted while the plugin
// is down, and the kubelet unprepares what it started to prepare.
func (h *crashHarness) kubeletPrepare(claim *resourceapi.ResourceClaim) {
	for {
		var err error
		if !killedDuring(func() { _, err = h.state.Prepare(h.e.Ctx, claim) }) {
			if err != nil && h.retryable != nil && h.retryable(err) {
				continue
			}
			if err != nil {
				h.t.Fatalf("prepare of %s (%s) after %d kills: %v", claim.UID, claimDevices(claim), h.stats.kills, err)
			}
			if h.prepared != nil {
				h.prepared(claim)
			}
			h.live[claim.UID] = claim
			return
		}
		if h.rng.IntN(4) == 0 {
			delete(h.api, claim.UID)
			h.stats.deletedWhileDown++
			h.restart()
			h.kubeletUnprepare(claim.UID)
			return
		}
		h.restart()
	}
}

// kubeletUnprepare unprepares until it succeeds; the claim is deleted
// afterwards, or sometimes while the plugin is down.
func (h *crashHarness) kubeletUnprepare(uid types.UID) {
	if h.countdown == 0 && h.rng.IntN(2) == 0 {
		h.arm()
	}
	for {
		var err error
		if !killedDuring(func() { err = h.state.Unprepare(h.e.Ctx, uid) }) {
			if err != nil {
				h.t.Fatalf("unprepare of %s after %d kills: %v", uid, h.stats.kills, err)
			}
			delete(h.live, uid)
			delete(h.api, uid)
			return
		}
		if _, ok := h.api[uid]; ok && h.rng.IntN(3) == 0 {
			delete(h.api, uid)
			h.stats.deletedWhileDown++
		}
		h.restart()
	}
}

// restart starts a new plugin process, until one survives its Restore;
// sometimes the new one is killed too.
func (h *crashHarness) restart() {
	for {
		h.stats.restarts++
		h.e.ReopenMachine(h.t, crashNode())
		h.hookMachine()
		s := h.e.newState(h.t)
		if h.tune != nil {
			h.tune(s)
		}
		objs := make([]runtime.Object, 0, len(h.api))
		for _, c := range h.api {
			objs = append(objs, c)
		}
		if h.countdown == 0 && h.rng.IntN(5) == 0 {
			h.arm()
		}
		var err error
		if !killedDuring(func() { _, err = s.Restore(h.e.Ctx, fake.NewClientset(objs...), h.e.Inventory, nil) }) {
			if err != nil {
				h.t.Errorf("restore: %v", err)
			}
			h.state = s
			return
		}
	}
}

func claimDevices(c *resourceapi.ResourceClaim) string {
	var names []string
	for _, r := range c.Status.Allocation.Devices.Results {
		names = append(names, r.Device)
	}
	return strings.Join(names, ",")
}

// newClaim allocates a claim as the scheduler would: a random device kind,
// a device no prepared claim holds (a MIG partition overlapping none).
func (h *crashHarness) newClaim(uid types.UID) (*resourceapi.ResourceClaim, string) {
	kinds := append([]string{"whole", "dynamic MIG", "static MIG", "replica", "share", "MPS"}, h.extraKinds...)
	first := h.rng.IntN(len(kinds))
	for i := range kinds {
		kind := kinds[(first+i)%len(kinds)]
		if c := h.claimOfKind(uid, kind); c != nil {
			return c, kind
		}
	}
	h.t.Fatal("no free device of any kind")
	return nil, ""
}

const mpsConfig = `{"apiVersion":"gpu.gpuaas.io/v1alpha1","kind":"GpuConfig","sharing":{"strategy":"MPS"}}`

func (h *crashHarness) claimOfKind(uid types.UID, kind string) *resourceapi.ResourceClaim {
	var free []string
	for _, d := range h.e.Devices {
		if h.fits(kind, &d) {
			free = append(free, d.Name())
		}
	}
	if len(free) == 0 {
		return nil
	}
	name := free[h.rng.IntN(len(free))]
	switch kind {
	case "share":
		return shareClaim(string(uid), "10Gi").Build()
	case "MPS":
		return preparetest.NewClaim(string(uid)).Device("gpu", name).Config(resourceapi.AllocationConfigSourceClaim, mpsConfig).Build()
	}
	return preparetest.NewClaim(string(uid)).Device("gpu", name).Build()
}

func (h *crashHarness) fits(kind string, d *device.AllocatableDevice) bool {
	switch {
	case kind == "share":
		return d.Type() == device.TypeShared
	case kind == "whole" && (d.Type() != device.TypeGPU || d.OnDynamicMIG()),
		kind == "static MIG" && d.StaticInstance() == nil,
		kind == "dynamic MIG" && d.Partition() == nil,
		kind == "dynamic whole" && (d.Type() != device.TypeGPU || !d.OnDynamicMIG()),
		kind == "replica" && (d.Type() != device.TypeTimeSlice || d.GPU.Index != 4),
		kind == "MPS" && (d.Type() != device.TypeTimeSlice || d.GPU.Index != 6):
		return false
	}
	return h.free(d)
}

// free tells whether no prepared claim holds the device and, for a MIG
// partition, whether the GPU's counters have room for it beside the
// prepared ones: the scheduler's arithmetic, with the whole GPU's
// consumption as the counter set's capacity.
func (h *crashHarness) free(d *device.AllocatableDevice) bool {
	var used []resourceapi.DeviceCounterConsumption
	for _, c := range h.live {
		for _, r := range c.Status.Allocation.Devices.Results {
			if r.Device == d.Name() {
				return false
			}
			if held := h.e.device(r.Device); held != nil && held.GPU.Index == d.GPU.Index {
				used = append(used, held.API.ConsumesCounters...)
			}
		}
	}
	if !d.OnDynamicMIG() {
		return true
	}
	// A whole GPU offered in dynamic mode consumes every counter: it fits
	// only where no partition is held, and holds off every partition.
	return countersFit(append(used, d.API.ConsumesCounters...), h.wholeGPU(d.GPU.Index).API.ConsumesCounters)
}

func (h *crashHarness) wholeGPU(index int) *device.AllocatableDevice {
	for i, d := range h.e.Devices {
		if d.Type() == device.TypeGPU && d.GPU.Index == index {
			return &h.e.Devices[i]
		}
	}
	h.t.Fatalf("no whole-GPU device on GPU %d", index)
	return nil
}

func countersFit(used, capacity []resourceapi.DeviceCounterConsumption) bool {
	total := map[string]int64{}
	for _, c := range used {
		for name, v := range c.Counters {
			total[c.CounterSet+"/"+name] += v.Value.Value()
		}
	}
	for _, c := range capacity {
		for name, v := range c.Counters {
			if total[c.CounterSet+"/"+name] > v.Value.Value() {
				return false
			}
		}
	}
	return true
}

// hookMachine puts fault points around every change of the current
// backend's mock machine, outside the persistence: a kill before one means
// the GPU never saw the call, after one that the plugin never saw the
// answer.
func (h *crashHarness) hookMachine() {
	for _, dev := range h.e.Lib.NVML().(*server.Server).Devices {
		h.hookDevice(dev.(*server.Device))
	}
}

func (h *crashHarness) hookDevice(d *server.Device) {
	setMig := d.SetMigModeFunc
	d.SetMigModeFunc = func(mode int) (nvml.Return, nvml.Return) {
		h.fault()
		a, r := setMig(mode)
		h.fault()
		return a, r
	}
	setCompute := d.SetComputeModeFunc
	d.SetComputeModeFunc = func(m nvml.ComputeMode) nvml.Return {
		h.fault()
		r := setCompute(m)
		h.fault()
		return r
	}
	create := d.CreateGpuInstanceWithPlacementFunc
	d.CreateGpuInstanceWithPlacementFunc = func(info *nvml.GpuInstanceProfileInfo, pl *nvml.GpuInstancePlacement) (nvml.GpuInstance, nvml.Return) {
		h.fault()
		gi, r := create(info, pl)
		if r == nvml.SUCCESS {
			h.hookGI(gi.(*server.GpuInstance))
		}
		h.fault()
		return gi, r
	}
	d.RLock()
	gis := make([]*server.GpuInstance, 0, len(d.GpuInstances))
	for gi := range d.GpuInstances {
		gis = append(gis, gi)
	}
	d.RUnlock()
	for _, gi := range gis {
		h.hookGI(gi)
	}
}

func (h *crashHarness) hookGI(gi *server.GpuInstance) {
	createCI := gi.CreateComputeInstanceFunc
	gi.CreateComputeInstanceFunc = func(info *nvml.ComputeInstanceProfileInfo) (nvml.ComputeInstance, nvml.Return) {
		h.fault()
		ci, r := createCI(info)
		if r == nvml.SUCCESS {
			h.hookCI(ci.(*server.ComputeInstance))
		}
		h.fault()
		return ci, r
	}
	destroy := gi.DestroyFunc
	gi.DestroyFunc = func() nvml.Return {
		h.fault()
		r := destroy()
		h.fault()
		return r
	}
	gi.RLock()
	cis := make([]*server.ComputeInstance, 0, len(gi.ComputeInstances))
	for ci := range gi.ComputeInstances {
		cis = append(cis, ci)
	}
	gi.RUnlock()
	for _, ci := range cis {
		h.hookCI(ci)
	}
}

func (h *crashHarness) hookCI(ci *server.ComputeInstance) {
	destroy := ci.DestroyFunc
	ci.DestroyFunc = func() nvml.Return {
		h.fault()
		r := destroy()
		h.fault()
		return r
	}
}

// faultyCDI puts fault points around CDI spec writes and deletes.
type faultyCDI struct {
	CDIWriter
	fault func()
}

func (f *faultyCDI) WriteClaimSpec(uid string, devices []cdi.Device) (map[string]string, error) {
	f.fault()
	ids, err := f.CDIWriter.WriteClaimSpec(uid, devices)
	f.fault()
	return ids, err
}

func (f *faultyCDI) DeleteClaimSpec(uid string) error {
	f.fault()
	err := f.CDIWriter.DeleteClaimSpec(uid)
	f.fault()
	return err
}

// fakeTools stands in for nvidia-smi and nvidia-cuda-mps-control: the
// interval each GPU was last set to, and MPS daemons that outlive the
// plugin as real ones do.
type fakeTools struct {
	root  string
	fault func()
	mu    sync.Mutex
	// intervals is the last --set-timeslice value by GPU; daemons the
	// GPUs whose MPS daemon runs.
	intervals map[string]string
	daemons   map[string]bool
}

func newFakeTools(t *testing.T, fault func()) *fakeTools {
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
	return &fakeTools{root: root, fault: fault, intervals: map[string]string{}, daemons: map[string]bool{}}
}

func (f *fakeTools) Run(_ context.Context, c timeslice.Cmd) ([]byte, error) {
	if filepath.Base(c.Path) == timeslice.NvidiaSMI {
		f.fault()
		f.set(func() { f.intervals[c.Args[2]] = strings.TrimPrefix(c.Args[3], "--set-timeslice=") })
		f.fault()
		return nil, nil
	}
	gpu := ""
	for _, kv := range c.Env {
		if v, ok := strings.CutPrefix(kv, "CUDA_VISIBLE_DEVICES="); ok {
			gpu = v
		}
	}
	switch {
	case slices.Equal(c.Args, []string{"-d"}):
		f.fault()
		f.set(func() { f.daemons[gpu] = true })
		f.fault()
	case c.Stdin == "quit\n" && f.running(gpu):
		f.fault()
		f.set(func() { delete(f.daemons, gpu) })
		f.fault()
	case !f.running(gpu):
		return nil, errors.New("cannot connect to the MPS control daemon")
	}
	return daemonAnswers(c.Stdin), nil
}

func (f *fakeTools) set(change func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	change()
}

func (f *fakeTools) running(gpu string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.daemons[gpu]
}

// crashLeaks counts what is left after every claim is gone.
type crashLeaks struct {
	specs, records, migDevices, staticChanged, computeModes, daemons, intervals int
}

func (l crashLeaks) total() int {
	return l.specs + l.records + l.migDevices + l.staticChanged + l.computeModes + l.daemons + l.intervals
}

func (l crashLeaks) String() string {
	return fmt.Sprintf("%d CDI specs, %d checkpoint records, %d MIG devices, %d static MIG changes, %d compute modes, %d MPS daemons, %d time-slice intervals",
		l.specs, l.records, l.migDevices, l.staticChanged, l.computeModes, l.daemons, l.intervals)
}

func (h *crashHarness) leaks() crashLeaks {
	t := h.t
	var l crashLeaks
	specs, err := cdi.NewHandler(cdi.Options{CDIRoot: h.e.CDIRoot, NVML: h.e.Lib.NVML()})
	if err != nil {
		t.Fatal(err)
	}
	uids, err := specs.ClaimSpecUIDs()
	if err != nil {
		t.Fatal(err)
	}
	l.specs = len(uids)
	store, err := checkpoint.NewStore(h.e.CkptDir)
	if err != nil {
		t.Fatal(err)
	}
	records, damaged, err := store.List()
	if err != nil {
		t.Fatal(err)
	}
	l.records = len(records) + len(damaged)
	for _, i := range []int{1, 2} {
		gis, err := mig.ListGPUInstances(h.mockGPUDevice(i))
		if err != nil {
			t.Fatal(err)
		}
		l.migDevices += len(gis)
	}
	if now := h.e.MIGDevices(t, 3); !slices.Equal(now, h.static) {
		l.staticChanged = 1
		t.Logf("static MIG layout %+v, was %+v", now, h.static)
	}
	for i := range h.e.Lib.GPUs() {
		if mode, ret := h.mockGPUDevice(i).GetComputeMode(); ret != nvml.SUCCESS || mode != nvml.COMPUTEMODE_DEFAULT {
			l.computeModes++
		}
	}
	l.daemons = len(h.tools.daemons)
	for _, v := range h.tools.intervals {
		if v != "0" {
			l.intervals++
		}
	}
	return l
}

func (h *crashHarness) mockGPUDevice(index int) nvml.Device {
	dev, err := h.e.Lib.DeviceByUUID(h.e.Lib.GPUs()[index].UUID)
	if err != nil {
		h.t.Fatal(err)
	}
	return dev
}
