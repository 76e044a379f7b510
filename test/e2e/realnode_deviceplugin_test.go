package e2e

// A device plugin next to ours on the real node (issue 25 item 8): users
// migrating from NVIDIA's device plugin, or running the GPU Operator's
// default, have both advertise the same GPUs, and pods of both get the
// same GPU. A small device plugin written here registers with the real
// kubelet and advertises nvidia.com/gpu with some of the node's (mock)
// GPU UUIDs, as NVIDIA's does; our plugin reads the kubelet's
// PodResources API through the chart's mount and withholds them.

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/coexist"
	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

// TestRealNodeDevicePlugin installs the chart (default coexistence:
// stand-down), starts a device plugin advertising GPUs 0 and 1 (GPU 1 as
// two time-slicing replicas, "<UUID>::<n>"), and checks: nothing is
// published and a Node event says why; with exclude-owned (an upgrade)
// exactly the other GPUs are published; with the device plugin gone every
// GPU is published again.
func TestRealNodeDevicePlugin(t *testing.T) {
	requireRealNode(t)
	n := startRealNode(t, func(o *framework.RealNodeOptions) { o.OwnDevicePluginDir = true })
	ctx := framework.Context(t, 15*time.Minute)
	valueFiles := installWithDevicePluginCheck(t, n)
	all := waitPublishedGPUs(t, ctx, "the chart installed, no device plugin", func(gpus []string) bool { return len(gpus) == 8 })
	uuids := gpuUUIDsByIndex(t, ctx)

	dp := startDevicePlugin(t, ctx, n, "nvidia.com/gpu", uuids[0], uuids[1]+"::0", uuids[1]+"::1")
	waitPublishedGPUs(t, ctx, "stand-down with a device plugin", func(gpus []string) bool { return len(gpus) == 0 })
	note := waitNodeEvent(t, ctx, coexist.ReasonDevicePluginStandDown)
	if !strings.Contains(note, "nvidia.com/gpu (3 device(s))") {
		t.Errorf("%s event %q, want it to name nvidia.com/gpu and its 3 devices", coexist.ReasonDevicePluginStandDown, note)
	}

	old := waitForPluginPod(t, ctx, "")
	exclude, err := n.WriteValues("values-exclude-owned.yaml", "kubeletPlugin:\n  devicePluginCoexistence: exclude-owned\n")
	if err != nil {
		t.Fatal(err)
	}
	helmOnCluster(t, append([]string{"upgrade", releaseName, chartPath, "--namespace", releaseNamespace},
		valueArgs(append(valueFiles, exclude))...)...)
	waitForPluginPod(t, ctx, old.UID)
	others := slices.DeleteFunc(slices.Clone(all), func(u string) bool { return u == uuids[0] || u == uuids[1] })
	waitPublishedGPUs(t, ctx, "exclude-owned with a device plugin owning GPUs 0 and 1", func(gpus []string) bool { return slices.Equal(gpus, others) })
	note = waitNodeEvent(t, ctx, coexist.ReasonDevicePluginGPUsExcluded)
	for _, want := range []string{"GPU 0 (" + uuids[0], "GPU 1 (" + uuids[1]} {
		if !strings.Contains(note, want) {
			t.Errorf("%s event %q, want it to name %s", coexist.ReasonDevicePluginGPUsExcluded, note, want)
		}
	}

	dp.stop()
	waitPublishedGPUs(t, ctx, "the device plugin gone", func(gpus []string) bool { return slices.Equal(gpus, all) })
	waitNodeEvent(t, ctx, coexist.ReasonDevicePluginGone)
}

// installWithDevicePluginCheck installs the chart with the suite's values
// and the device-plugin check every second (the default 30 s would only
// make the test slow), uninstalls it when the test ends, and returns the
// values files.
func installWithDevicePluginCheck(t *testing.T, n *realNode) []string {
	t.Helper()
	ctx := framework.Context(t, 6*time.Minute)
	values, err := n.ChartValues(2)
	if err != nil {
		t.Fatal(err)
	}
	base, err := n.WriteValues("values-install.yaml", values)
	if err != nil {
		t.Fatal(err)
	}
	check, err := n.WriteValues("values-device-plugin.yaml", "kubeletPlugin:\n  devicePluginCheckInterval: 1s\n")
	if err != nil {
		t.Fatal(err)
	}
	files := []string{base, check}
	uninstallOnCleanup(t, ctx, helmBin(t))
	helmOnCluster(t, append([]string{"install", releaseName, chartPath, "--namespace", releaseNamespace, "--create-namespace"},
		valueArgs(files)...)...)
	waitForPluginPod(t, ctx, "")
	return files
}

// valueArgs are helm's arguments for values files, later files winning.
func valueArgs(files []string) []string {
	var args []string
	for _, f := range files {
		args = append(args, "-f", f)
	}
	return args
}

// publishedGPUsOf are the UUIDs of the GPUs a complete pool offers
// devices of (a MIG device or replica counts for its GPU), sorted; ok is
// false while the newest generation of the pool is incomplete.
func publishedGPUsOf(ctx context.Context) (gpus []string, ok bool, err error) {
	list, err := cp.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{
		FieldSelector: resourceapi.ResourceSliceSelectorNodeName + "=" + realNodeName})
	if err != nil {
		return nil, false, err
	}
	var gen, have, want int64
	for _, s := range list.Items {
		if s.Spec.Driver == framework.DriverName {
			gen = max(gen, s.Spec.Pool.Generation)
		}
	}
	for _, s := range list.Items {
		if s.Spec.Driver != framework.DriverName || s.Spec.Pool.Generation != gen {
			continue
		}
		have, want = have+1, s.Spec.Pool.ResourceSliceCount
		for _, d := range s.Spec.Devices {
			uuid := stringAttr(d, "parentUUID")
			if uuid == "" {
				uuid = stringAttr(d, "uuid")
			}
			if !slices.Contains(gpus, uuid) {
				gpus = append(gpus, uuid)
			}
		}
	}
	slices.Sort(gpus)
	return gpus, have > 0 && have == want, nil
}

// waitPublishedGPUs waits until the published GPUs satisfy cond.
func waitPublishedGPUs(t *testing.T, ctx context.Context, what string, cond func([]string) bool) []string {
	t.Helper()
	var gpus []string // the last complete pool's
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		got, ok, err := publishedGPUsOf(ctx)
		if err != nil || !ok {
			return false, nil
		}
		gpus = got
		return cond(gpus), nil
	})
	if err != nil {
		t.Fatalf("%s: the node publishes devices of GPUs %v: %v", what, gpus, err)
	}
	return gpus
}

// gpuUUIDsByIndex reads the GPUs' UUIDs from the whole GPUs published.
func gpuUUIDsByIndex(t *testing.T, ctx context.Context) map[int64]string {
	t.Helper()
	devices, err := cp.PoolDevices(ctx, realNodeName)
	if err != nil {
		t.Fatal(err)
	}
	out := map[int64]string{}
	for _, d := range devices {
		if i, ok := intAttr(d, "index"); ok && stringAttr(d, "parentUUID") == "" {
			out[i] = stringAttr(d, "uuid")
		}
	}
	if out[0] == "" || out[1] == "" {
		t.Fatalf("no UUIDs of GPUs 0 and 1 among the published devices: %v", out)
	}
	return out
}

// waitNodeEvent waits for an event of the plugin's with reason on the
// real node and returns its note.
func waitNodeEvent(t *testing.T, ctx context.Context, reason string) string {
	t.Helper()
	var note string
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		events, err := cp.Client.EventsV1().Events(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		for _, e := range events.Items {
			if e.Regarding.Kind == "Node" && e.Regarding.Name == realNodeName && e.Reason == reason {
				note = e.Note
			}
		}
		return note != "", nil
	})
	if err != nil {
		t.Fatalf("no Node event %s on %s: %v", reason, realNodeName, err)
	}
	t.Logf("Node event %s: %s", reason, note)
	return note
}

// testDevicePlugin is a device plugin as the kubelet sees one: it serves
// the v1beta1 DevicePlugin API on a socket in the kubelet's device-plugins
// directory and registers there, advertising fixed device IDs, all
// healthy. It never runs a pod.
type testDevicePlugin struct {
	pluginapi.UnimplementedDevicePluginServer
	ids    []string
	srv    *grpc.Server
	socket string
	once   sync.Once
}

func startDevicePlugin(t *testing.T, ctx context.Context, n *realNode, resource string, ids ...string) *testDevicePlugin {
	t.Helper()
	dir := n.DevicePluginDir
	dp := &testDevicePlugin{ids: ids, srv: grpc.NewServer(), socket: filepath.Join(dir, "e2e-nvidia.sock")}
	lis, err := net.Listen("unix", dp.socket)
	if err != nil {
		t.Fatal(err)
	}
	pluginapi.RegisterDevicePluginServer(dp.srv, dp)
	go func() { _ = dp.srv.Serve(lis) }()
	t.Cleanup(dp.stop)
	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, "kubelet.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version: pluginapi.Version, Endpoint: filepath.Base(dp.socket), ResourceName: resource,
		Options: &pluginapi.DevicePluginOptions{}})
	if err != nil {
		t.Fatalf("registering a device plugin for %s with the kubelet: %v", resource, err)
	}
	// The kubelet reports the resource on the Node once it has the list.
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		node, err := cp.Client.CoreV1().Nodes().Get(ctx, realNodeName, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		q, ok := node.Status.Allocatable[v1.ResourceName(resource)]
		return ok && q.Value() == int64(len(ids)), nil
	})
	if err != nil {
		t.Fatalf("the Node never showed %d %s: %v", len(ids), resource, err)
	}
	return dp
}

// stop ends the device plugin as an uninstalled one ends: its socket goes,
// and the kubelet's stream of its devices breaks.
func (dp *testDevicePlugin) stop() {
	dp.once.Do(func() {
		dp.srv.Stop()
		_ = os.Remove(dp.socket)
	})
}

// GetDevicePluginOptions implements pluginapi.DevicePluginServer.
func (dp *testDevicePlugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

// ListAndWatch implements pluginapi.DevicePluginServer: the devices once,
// then nothing until the plugin stops.
func (dp *testDevicePlugin) ListAndWatch(_ *pluginapi.Empty, stream grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	resp := &pluginapi.ListAndWatchResponse{}
	for _, id := range dp.ids {
		resp.Devices = append(resp.Devices, &pluginapi.Device{ID: id, Health: pluginapi.Healthy})
	}
	if err := stream.Send(resp); err != nil {
		return fmt.Errorf("sending the device list: %w", err)
	}
	<-stream.Context().Done()
	return nil
}
