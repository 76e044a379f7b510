package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/inventory"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/prepare"

	configapi "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/cdi"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev/nvmock"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/checkpoint"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health/grpc_health_v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2/ktesting"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

const node = "node-a"

// testFlags are the flags of a plugin on a simulated node in dir.
func testFlags(t *testing.T, dir string) flags {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	_ = lis.Close()
	f := flags{nodeName: node, pluginDataDir: filepath.Join(dir, "plugin"), registrarDir: filepath.Join(dir, "registry"),
		cdiRoot: filepath.Join(dir, "cdi"), driverRoot: filepath.Join(dir, "driver"), healthAddr: addr,
		cdiHookPath: cdi.HooksDisabled, bootIDPath: filepath.Join(dir, "boot_id"), mpsDaemons: mpsInProcesses,
		mockStateDir: filepath.Join(dir, "mock-nvml"), driverRetry: 50 * time.Millisecond}
	for _, d := range []string{f.pluginDataDir, f.registrarDir, f.cdiRoot, f.driverRoot} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(f.bootIDPath, []byte("boot-1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// probe asks the plugin's health endpoint about service, as the kubelet's
// grpc probe does; "" when the endpoint does not answer.
func probe(t *testing.T, addr, service string) string {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	resp, err := grpc_health_v1.NewHealthClient(conn).Check(ctx, &grpc_health_v1.HealthCheckRequest{Service: service})
	if err != nil {
		return ""
	}
	return resp.GetStatus().String()
}

type probes struct{ liveness, startup, readiness string }

func probeAll(t *testing.T, addr string) probes {
	return probes{probe(t, addr, plugin.HealthServiceLiveness), probe(t, addr, plugin.HealthServiceStartup),
		probe(t, addr, plugin.HealthServiceReadiness)}
}

// running is a plugin run in this process.
type running struct {
	done chan struct{} // closed when runWith returned
	err  error
}

// exited reports whether the plugin stopped, and why.
func (r *running) exited() (bool, error) {
	select {
	case <-r.done:
		return true, r.err
	default:
		return false, nil
	}
}

// apiServer is a fake clientset that answers dry-run creates as the API
// server does: the object back, nothing stored (the plugin asks what the
// cluster keeps of its slices that way, sliceprobe).
func apiServer(objects ...runtime.Object) *fake.Clientset {
	c := fake.NewClientset(objects...)
	c.PrependReactor("create", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
		create, ok := a.(k8stesting.CreateActionImpl)
		if !ok || len(create.CreateOptions.DryRun) == 0 {
			return false, nil, nil
		}
		return true, create.Object, nil
	})
	return c
}

// startPlugin runs the plugin in this process until the test ends.
func startPlugin(t *testing.T, f flags, objects ...runtime.Object) *running {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	r := &running{done: make(chan struct{})}
	go func() { r.err = runWith(ctx, f, apiServer(objects...)); close(r.done) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-r.done:
		case <-time.After(2 * time.Minute):
			t.Error("the plugin did not stop")
		}
	})
	return r
}

// Issue 25 item 5: with the GPU Operator's driver root not ready yet (an
// empty /run/nvidia/driver) the plugin exited ("NVML library not found")
// and crash-looped. Now it waits: alive (liveness and startup serving, so
// the kubelet neither kills it nor counts a failed start), not ready.
func TestWaitingForTheDriverIsNotReadyNotACrash(t *testing.T) {
	f := testFlags(t, t.TempDir())
	f.nvml, f.mockStateDir = nvdev.BackendReal, ""
	f.driverRoot = filepath.Join(t.TempDir(), "run", "nvidia", "driver")
	done := startPlugin(t, f)
	want := probes{"SERVING", "SERVING", "NOT_SERVING"}
	var got probes
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if exited, err := done.exited(); exited {
			t.Fatalf("the plugin exited while the driver is not there: %v", err)
		}
		if got = probeAll(t, f.healthAddr); got == want {
			break
		}
	}
	if got != want {
		t.Fatalf("probes (liveness, startup, readiness) = %v, want %v", got, want)
	}
	time.Sleep(time.Second)
	if exited, err := done.exited(); exited {
		t.Fatalf("the plugin exited while the driver is not there: %v", err)
	}
	if got := probeAll(t, f.healthAddr); got != want {
		t.Errorf("a second later: %v, want %v", got, want)
	}
}

// Issue 25 item 3: after a reboot a packed MIG node restores every MIG
// device of every prepared claim, each taking about a second to make. The
// health port used to open only after that (the liveness probe's 10 s +
// 3 x 10 s then killed the plugin part-way, and the next start began
// again). Now it answers from the start: alive throughout, its start step
// named, ready only once registered with the kubelet, and the whole
// restore within what the chart's startupProbe allows.
func TestSlowRestoreIsAliveAndNotReadyUntilRegistered(t *testing.T) {
	if testing.Short() {
		t.Skip("restores 56 MIG devices at a second each")
	}
	dir := t.TempDir()
	f := testFlags(t, dir)
	f.nvml = "mock:dgxh100"
	f.nodeConfig = filepath.Join(dir, "node-config.yaml")
	if err := os.WriteFile(f.nodeConfig, []byte("apiVersion: gpu.gpuaas.io/v1alpha1\nkind: NodeConfig\ndefault: {mig: dynamic}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	claims := prepareMIGClaims(t, f)
	if _, err := nvmock.Reboot(f.mockStateDir, f.bootIDPath); err != nil {
		t.Fatal(err)
	}
	if err := nvmock.SetCreateDelay(f.mockStateDir, time.Second); err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	done := startPlugin(t, f, claims...)
	for probe(t, f.healthAddr, plugin.HealthServiceLiveness) == "" {
		if time.Since(start) > 5*time.Second {
			t.Fatal("the health endpoint did not open within 5 s of the start")
		}
		time.Sleep(10 * time.Millisecond)
	}
	var sawRestoring bool
	for {
		if exited, err := done.exited(); exited {
			t.Fatalf("the plugin exited: %v", err)
		}
		if socketExists(f.registrarDir) {
			break // started: the rest is the kubelet's registration
		}
		got := probeAll(t, f.healthAddr)
		if got.liveness != "SERVING" && !socketExists(f.registrarDir) {
			t.Fatalf("after %s: liveness %q during the start", time.Since(start).Round(time.Second), got.liveness)
		}
		if got.readiness == "SERVING" {
			t.Fatalf("ready before the kubelet registered the plugin: %v", got)
		}
		if got.startup == "NOT_SERVING" {
			sawRestoring = true
		}
		if time.Since(start) > 5*time.Minute {
			t.Fatalf("the start did not finish in 5 minutes: %v", got)
		}
		time.Sleep(200 * time.Millisecond)
	}
	took := time.Since(start)
	if !sawRestoring {
		t.Error("the startup service never said the start was under way")
	}
	if took < 56*time.Second {
		t.Errorf("the restore took %s: were the 56 MIG devices made again, a second each?", took)
	}
	if budget := chartStartupBudget(t); took > budget/2 {
		t.Errorf("the restore took %s, more than half the chart's startupProbe budget (%s)", took, budget)
	}
	t.Logf("restored 56 MIG devices in %s", took.Round(time.Second))

	register(t, f.registrarDir)
	want := probes{"SERVING", "SERVING", "SERVING"}
	var got probes
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if got = probeAll(t, f.healthAddr); got == want {
			return
		}
	}
	t.Errorf("registered: probes %v, want %v", got, want)
}

func socketExists(registrarDir string) bool {
	m, _ := filepath.Glob(filepath.Join(registrarDir, "*.sock"))
	return len(m) > 0
}

// register plays the kubelet's plugin watcher: GetInfo, then
// NotifyRegistrationStatus(registered).
func register(t *testing.T, registrarDir string) {
	t.Helper()
	m, _ := filepath.Glob(filepath.Join(registrarDir, "*.sock"))
	if len(m) != 1 {
		t.Fatalf("registration sockets %v", m)
	}
	conn, err := grpc.NewClient("unix:"+m[0], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	reg := registerapi.NewRegistrationClient(conn)
	if _, err := reg.GetInfo(ctx, &registerapi.InfoRequest{}); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: true}); err != nil {
		t.Fatal(err)
	}
}

// prepareMIGClaims prepares, as a plugin process before the reboot, one
// claim per 1g.10gb MIG device of every GPU: 8 x 7 = 56. It returns the
// claims as the API holds them.
func prepareMIGClaims(t *testing.T, f flags) []runtime.Object {
	t.Helper()
	logger, ctx := ktesting.NewTestContext(t)
	lib, err := nvdev.Open(nvdev.Options{Backend: f.nvml, MockSeed: node, MockStateDir: f.mockStateDir})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lib.Shutdown() }()
	cfg, err := readNodeConfig(f.nodeConfig)
	if err != nil {
		t.Fatal(err)
	}
	handler, err := cdi.NewHandler(cdi.Options{CDIRoot: f.cdiRoot, NVML: lib.NVML(), CDIHookPath: cdi.HooksDisabled})
	if err != nil {
		t.Fatal(err)
	}
	store, err := checkpoint.NewStore(filepath.Join(f.pluginDataDir, "claims"))
	if err != nil {
		t.Fatal(err)
	}
	s := prepare.NewState(prepare.StateConfig{NodeName: node, Devices: inventory.Discover(logger, lib, cfg).Devices, NVML: lib,
		CDI: handler, Store: store, BootIDPath: f.bootIDPath, LockDir: filepath.Join(f.pluginDataDir, "locks")})
	var claims []runtime.Object
	for gpu := range 8 {
		for slot := range 7 {
			uid := fmt.Sprintf("c-%d-%d", gpu, slot)
			claim := &resourceapi.ResourceClaim{
				ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "claim-" + uid, UID: types.UID(uid)},
				Status: resourceapi.ResourceClaimStatus{
					Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
						Results: []resourceapi.DeviceRequestAllocationResult{{Request: "mig", Driver: configapi.DriverName,
							Pool: node, Device: fmt.Sprintf("gpu-%d-mig-1g10gb-%d", gpu, slot)}},
					}},
					ReservedFor: []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "p", UID: types.UID("pod-" + uid)}},
				},
			}
			if _, err := s.Prepare(ctx, claim); err != nil {
				t.Fatalf("preparing %s: %v", uid, err)
			}
			claims = append(claims, claim)
		}
	}
	return claims
}

// chartStartupBudget is how long the chart's startupProbe lets a start
// take by default (periodSeconds x failureThreshold).
func chartStartupBudget(t *testing.T) time.Duration {
	t.Helper()
	data, err := os.ReadFile("../../deployments/helm/gpuaas-dra/values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(data), "\nkubeletPlugin:")
	if !ok {
		t.Fatal("no kubeletPlugin section in values.yaml")
	}
	var seconds int
	for _, line := range strings.Split(rest, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "startupTimeoutSeconds:"); ok {
			if _, err := fmt.Sscan(v, &seconds); err != nil {
				t.Fatal(err)
			}
			break
		}
	}
	if seconds == 0 {
		t.Fatal("no kubeletPlugin.startupTimeoutSeconds in values.yaml")
	}
	return time.Duration(seconds) * time.Second
}
