package plugin

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/coexist"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/inventory"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/telemetry"

	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/deviceplugins/podresourcestest"
	"github.com/gpuaas/gpu-dra-driver/pkg/mig"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev/nvmock"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/prepare/preparetest"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/klog/v2/ktesting"
)

// Issue 25 item 8: a device plugin (NVIDIA's, or the GPU Operator's
// default) hands out the node's GPUs as nvidia.com/gpu while this plugin
// publishes them too, and pods of both get the same GPU. The plugin now
// asks the kubelet's PodResources API (here a real gRPC server of the
// kubelet's generated interface on a Unix socket) which GPUs a device
// plugin advertises, and withholds them.

// dpDriver is a driver whose device-plugin check asks srv's socket.
func dpDriver(t *testing.T, e *testEnv, cfg *configapi.NodeConfig, mode coexist.Coexistence, socket string) (*Driver, *capturePublisher) {
	t.Helper()
	return dpDriverEvery(t, e, cfg, mode, socket, 0)
}

// dpDriverEvery is dpDriver checking again every interval (zero: the
// default).
func dpDriverEvery(t *testing.T, e *testEnv, cfg *configapi.NodeConfig, mode coexist.Coexistence, socket string, interval time.Duration) (*Driver, *capturePublisher) {
	t.Helper()
	d, pub := testDriver(t, e, cfg)
	events := telemetry.NewNodeEvents(context.Background(), e.Events, nil, testNode)
	d.dp = coexist.NewWatch(coexist.DevicePluginCheck{Coexistence: mode, Socket: socket, Interval: interval}, e.Lib, events, e.Metrics)
	return d, pub
}

// check runs one check and publishes what it decided.
func check(t *testing.T, ctx context.Context, d *Driver) {
	t.Helper()
	d.checkDevicePlugins(ctx, false)
	if err := d.publish(ctx); err != nil {
		t.Fatal(err)
	}
}

// publishedGPUs are the UUIDs of the GPUs the last publish offers
// devices of, and the names of its counter sets.
func publishedGPUs(t *testing.T, pub *capturePublisher) (gpus, counterSets []string) {
	t.Helper()
	for _, s := range pub.last(t).Slices {
		for _, cs := range s.SharedCounters {
			counterSets = append(counterSets, cs.Name)
		}
		for _, d := range s.Devices {
			uuid := d.Attributes["uuid"].StringValue
			if p := d.Attributes["parentUUID"].StringValue; p != nil {
				uuid = p
			}
			if uuid != nil && !slices.Contains(gpus, *uuid) {
				gpus = append(gpus, *uuid)
			}
		}
	}
	slices.Sort(gpus)
	slices.Sort(counterSets)
	return gpus, counterSets
}

func uuidsOf(lib nvdev.Interface, indexes ...int) []string {
	var out []string
	for _, g := range lib.GPUs() {
		if len(indexes) == 0 || slices.Contains(indexes, g.Index) {
			out = append(out, g.UUID)
		}
	}
	slices.Sort(out)
	return out
}

// TestDevicePluginStandDown: while a device plugin advertises any NVIDIA
// GPU here, the default mode publishes nothing and says why; when it
// goes away, every GPU is published again, and said so.
func TestDevicePluginStandDown(t *testing.T) {
	srv := podresourcestest.Start(t)
	e := newTestEnv(t, "dgxh100")
	d, pub := dpDriver(t, e, &configapi.NodeConfig{}, coexist.CoexistenceStandDown, srv.Socket)
	check(t, e.Ctx, d)
	if got, _ := publishedGPUs(t, pub); !slices.Equal(got, uuidsOf(e.Lib)) {
		t.Fatalf("without a device plugin: published %v, want all 8 GPUs", got)
	}

	srv.SetAllocatable(podresourcestest.Devices("nvidia.com/gpu", e.Lib.GPUs()[1].UUID))
	d.checkDevicePlugins(e.Ctx, true)
	if got, sets := publishedGPUs(t, pub); len(got) != 0 || len(sets) != 0 {
		t.Errorf("a device plugin advertises GPU 1: published GPUs %v and counter sets %v, want none", got, sets)
	}
	if ev := e.Events.WithReason(coexist.ReasonDevicePluginStandDown); len(ev) != 1 || !strings.Contains(ev[0], "nvidia.com/gpu (1 device(s))") {
		t.Errorf("stand-down events %q, want one naming nvidia.com/gpu", ev)
	}
	if got := testutil.ToFloat64(e.Metrics.DpWithheld); got != 8 {
		t.Errorf("device_plugin_withheld_gpus = %v, want 8", got)
	}

	// Checked again with the same answer: nothing new said or published.
	n := pub.count()
	d.checkDevicePlugins(e.Ctx, true)
	if pub.count() != n || len(e.Events.WithReason(coexist.ReasonDevicePluginStandDown)) != 1 {
		t.Errorf("an unchanged answer republished (%d -> %d) or warned again", n, pub.count())
	}

	srv.SetAllocatable()
	d.checkDevicePlugins(e.Ctx, true)
	if got, _ := publishedGPUs(t, pub); !slices.Equal(got, uuidsOf(e.Lib)) {
		t.Errorf("the device plugin gone: published %v, want all 8 GPUs again", got)
	}
	if !slices.ContainsFunc(e.Events.Events, func(ev string) bool { return strings.HasPrefix(ev, "Normal "+coexist.ReasonDevicePluginGone+" ") }) {
		t.Errorf("events %q, want a Normal %s", e.Events.Events, coexist.ReasonDevicePluginGone)
	}
	if got := testutil.ToFloat64(e.Metrics.DpWithheld); got != 0 {
		t.Errorf("device_plugin_withheld_gpus = %v after the device plugin left, want 0", got)
	}
}

// TestDevicePluginExcludeOwned: exclude-owned publishes exactly the GPUs
// no device-plugin ID names, for each kind of ID NVIDIA's device plugin
// uses, and drops the withheld GPUs' counter sets with their devices.
func TestDevicePluginExcludeOwned(t *testing.T) {
	stateDir := t.TempDir()
	made, err := nvmock.LayoutMIG(stateDir, "dgxh100", testNode, 5, []string{"3g.40gb", "1g.10gb"})
	if err != nil {
		t.Fatal(err)
	}
	cfg := &configapi.NodeConfig{GPUs: []configapi.GpuModeSelector{
		{Indexes: []int{5}, GpuMode: configapi.GpuMode{MIG: configapi.MigStatic}},
		{Indexes: []int{6}, GpuMode: configapi.GpuMode{TimeSlicing: &configapi.TimeSlicingMode{Replicas: 2}}},
	}}
	e := newTestEnvIn(t, "dgxh100", cfg, stateDir)
	gpus := e.Lib.GPUs()
	srv := podresourcestest.Start(t)
	d, pub := dpDriver(t, e, cfg, coexist.CoexistenceExcludeOwned, srv.Socket)
	for _, tc := range []struct {
		name   string
		set    func()
		owned  []int
		reason string
	}{
		{"GPU UUID", func() { srv.SetAllocatable(podresourcestest.Devices("nvidia.com/gpu", gpus[0].UUID)) }, []int{0}, ""},
		{"time-slicing replicas", func() {
			srv.SetAllocatable(podresourcestest.Devices("nvidia.com/gpu", gpus[1].UUID+"::0", gpus[1].UUID+"::1"))
		}, []int{1}, ""},
		{"index strategy", func() { srv.SetAllocatable(podresourcestest.Devices("nvidia.com/gpu", "2", "3")) }, []int{2, 3}, ""},
		{"MIG device of a static MIG GPU", func() {
			srv.SetAllocatable(podresourcestest.Devices("nvidia.com/mig-1g.10gb", made[1].UUID))
		}, []int{5}, ""},
		{"held by a running pod only", func() {
			srv.SetAllocatable()
			srv.SetPodDevices(podresourcestest.Devices("nvidia.com/gpu", gpus[4].UUID))
		}, []int{4}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv.SetAllocatable()
			srv.SetPodDevices()
			tc.set()
			check(t, e.Ctx, d)
			got, sets := publishedGPUs(t, pub)
			want := slices.DeleteFunc(uuidsOf(e.Lib), func(u string) bool { return slices.Contains(uuidsOf(e.Lib, tc.owned...), u) })
			if !slices.Equal(got, want) {
				t.Errorf("published %v, want all but GPUs %v: %v", got, tc.owned, want)
			}
			for _, i := range tc.owned {
				if slices.Contains(sets, mig.CounterSetName(i)) {
					t.Errorf("the counter set of withheld GPU %d is published", i)
				}
			}
			if len(sets) != len(gpus)-len(tc.owned) {
				t.Errorf("counter sets %v, want one per published GPU", sets)
			}
			ev := e.Events.WithReason(coexist.ReasonDevicePluginGPUsExcluded)
			if len(ev) == 0 || !strings.Contains(ev[len(ev)-1], fmt.Sprintf("GPU %d (%s", tc.owned[0], gpus[tc.owned[0]].UUID)) {
				t.Errorf("exclusion events %q, want the last to name GPU %d", ev, tc.owned[0])
			}
			if got := testutil.ToFloat64(e.Metrics.DpWithheld); got != float64(len(tc.owned)) {
				t.Errorf("device_plugin_withheld_gpus = %v, want %d", got, len(tc.owned))
			}
		})
	}
}

// TestDevicePluginCheckWithoutSocket: no PodResources socket (the pod
// does not mount it) is "unknown": every GPU is published, a warning is
// logged and put on the Node once, and the failure is counted; nothing
// crashes.
func TestDevicePluginCheckWithoutSocket(t *testing.T) {
	e := newTestEnv(t, "dgxh100")
	d, pub := dpDriver(t, e, &configapi.NodeConfig{}, coexist.CoexistenceStandDown, filepath.Join(t.TempDir(), "kubelet.sock"))
	check(t, e.Ctx, d)
	d.checkDevicePlugins(e.Ctx, true)
	if got, _ := publishedGPUs(t, pub); !slices.Equal(got, uuidsOf(e.Lib)) {
		t.Errorf("published %v without a socket, want every GPU", got)
	}
	if ev := e.Events.WithReason(coexist.ReasonDevicePluginCheckFailed); len(ev) != 1 || !strings.Contains(ev[0], "publishing every GPU") {
		t.Errorf("check-failed events %q, want one saying every GPU is published", ev)
	}
	if got := testutil.ToFloat64(e.Metrics.DpCheckFailed); got != 1 {
		t.Errorf("device_plugin_check_failed = %v, want 1", got)
	}
}

// TestDevicePluginCheckFailureKeepsTheLastAnswer: once the kubelet has
// answered, an unanswered check (a kubelet restart) changes nothing.
func TestDevicePluginCheckFailureKeepsTheLastAnswer(t *testing.T) {
	srv := podresourcestest.Start(t)
	e := newTestEnv(t, "dgxh100")
	d, pub := dpDriver(t, e, &configapi.NodeConfig{}, coexist.CoexistenceStandDown, srv.Socket)
	srv.SetAllocatable(podresourcestest.Devices("nvidia.com/gpu", "0"))
	check(t, e.Ctx, d)
	srv.Fail(errors.New("kubelet restarting"))
	d.checkDevicePlugins(e.Ctx, true)
	if got, _ := publishedGPUs(t, pub); len(got) != 0 {
		t.Errorf("standing down, then the API failed: published %v, want still none", got)
	}
	if ev := e.Events.WithReason(coexist.ReasonDevicePluginCheckFailed); len(ev) != 1 || !strings.Contains(ev[0], "keeping its last answer") {
		t.Errorf("check-failed events %q, want one saying the last answer is kept", ev)
	}
	srv.Fail(nil)
	d.checkDevicePlugins(e.Ctx, true)
	if got := testutil.ToFloat64(e.Metrics.DpCheckFailed); got != 0 {
		t.Errorf("device_plugin_check_failed = %v once the API answers, want 0", got)
	}
}

// TestDevicePluginCheckOff: off asks nobody and publishes everything.
func TestDevicePluginCheckOff(t *testing.T) {
	srv := podresourcestest.Start(t)
	srv.SetAllocatable(podresourcestest.Devices("nvidia.com/gpu", "0"))
	e := newTestEnv(t, "dgxh100")
	d, pub := dpDriver(t, e, &configapi.NodeConfig{}, coexist.CoexistenceOff, srv.Socket)
	check(t, e.Ctx, d)
	if got, _ := publishedGPUs(t, pub); !slices.Equal(got, uuidsOf(e.Lib)) || d.dp != nil {
		t.Errorf("off: published %v, want every GPU, and no check", got)
	}
}

// TestPreparedClaimsUnpreparableWhileStandingDown: standing down changes
// what is offered, never what is prepared.
func TestPreparedClaimsUnpreparableWhileStandingDown(t *testing.T) {
	srv := podresourcestest.Start(t)
	e := newTestEnv(t, "dgxh100")
	d, pub := dpDriver(t, e, &configapi.NodeConfig{}, coexist.CoexistenceStandDown, srv.Socket)
	check(t, e.Ctx, d)
	if _, err := e.state.Prepare(e.Ctx, preparetest.NewClaim("a").Device("gpu", "gpu-1").Build()); err != nil {
		t.Fatal(err)
	}
	srv.SetAllocatable(podresourcestest.Devices("nvidia.com/gpu", e.Lib.GPUs()[1].UUID))
	d.checkDevicePlugins(e.Ctx, true)
	if got, _ := publishedGPUs(t, pub); len(got) != 0 {
		t.Fatalf("published %v, want none", got)
	}
	if err := e.state.Unprepare(e.Ctx, "a"); err != nil {
		t.Errorf("unpreparing a claim prepared before the stand-down: %v", err)
	}
	if e.CDISpecExists("a") {
		t.Error("the claim's CDI spec is left after unprepare")
	}
}

// TestDevicePluginWatchRepublishes: the periodic check follows a device
// plugin installed while the plugin runs.
func TestDevicePluginWatchRepublishes(t *testing.T) {
	srv := podresourcestest.Start(t)
	e := newTestEnv(t, "dgxh100")
	d, pub := dpDriverEvery(t, e, &configapi.NodeConfig{}, coexist.CoexistenceStandDown, srv.Socket, 10*time.Millisecond)
	ctx, cancel := context.WithCancel(e.Ctx)
	defer cancel()
	check(t, ctx, d)
	d.watchDevicePlugins(ctx)
	srv.SetAllocatable(podresourcestest.Devices("nvidia.com/gpu", e.Lib.GPUs()[0].UUID))
	var got []string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if got, _ = publishedGPUs(t, pub); len(got) == 0 {
			break
		}
	}
	if len(got) != 0 {
		t.Errorf("a device plugin appeared: still publishing %v", got)
	}
}

// TestWithheldGPUKeepsTheOthersSlices: withholding a dynamic-MIG GPU
// leaves every other device in the slice it had (each dynamic-MIG GPU's
// devices together, the deferred placements after all others), which the
// allocator's first-fit order and the counters' slice rules depend on.
func TestWithheldGPUKeepsTheOthersSlices(t *testing.T) {
	cfg := &configapi.NodeConfig{GPUs: []configapi.GpuModeSelector{
		{Indexes: []int{5, 6, 7}, GpuMode: configapi.GpuMode{MIG: configapi.MigDynamic}}}}
	e := newTestEnvWith(t, "dgxh100", cfg)
	inv := inventory.Discover(ktesting.NewLogger(t, ktesting.NewConfig()), e.Lib, cfg)
	withheld := e.Lib.GPUs()[6].UUID
	gpuOf := map[string]string{}
	for _, d := range inv.Devices {
		gpuOf[d.Name()] = d.GPU.UUID
	}
	sliceNames := func(inv inventory.Inventory, skip string) [][]string {
		var out [][]string
		for _, s := range inventory.Resources(testNode, inv).Pools[testNode].Slices {
			var names []string
			for _, d := range s.Devices {
				if gpuOf[d.Name] != skip {
					names = append(names, d.Name)
				}
			}
			if len(names) > 0 {
				out = append(out, names)
			}
		}
		return out
	}
	want := sliceNames(inv, withheld)
	got := sliceNames(inv.WithoutGPUs(map[string]bool{withheld: true}), "")
	if !reflect.DeepEqual(got, want) {
		t.Errorf("GPU 6 withheld: slices %v, want the others' slices as before %v", got, want)
	}
}
