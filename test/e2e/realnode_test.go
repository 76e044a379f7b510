package e2e

// Tests on a real node: the kubelet, containerd and runc of this machine run
// what `helm install` of the chart deploys (the plugin DaemonSet, the
// controller Deployment, under the chart's RBAC), and pods whose containers
// print what our CDI specs gave them. The GPUs are simulated (mock NVML and
// a driver root of mknod'ed device nodes); everything else is what a user
// runs.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/dynamic-resource-allocation/resourceclaim"
	"k8s.io/utils/ptr"

	"github.com/gpuaas/gpu-dra-driver/hack/nvmlshim/shimbuild"
	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

const (
	releaseName      = "gpuaas"
	releaseNamespace = "gpuaas-system"
	realNodeName     = "real-gpu-node"
	// extendedResource is what device-plugin-era pods ask for; a DeviceClass
	// maps it to our whole GPUs (KEP-5004).
	extendedResource = "nvidia.com/gpu"
)

// realNode is the suite's real node with the chart installed, shared by the
// subtests of TestRealNode in order.
type realNode struct {
	*framework.RealNode
	values string // the values of the installed release
}

// TestRealNode installs the chart on a real node and runs claims through
// it: a template claim, an extended-resource request, every demo spec, an
// upgrade that rolls the plugin, and an uninstall that must leave nothing.
func TestRealNode(t *testing.T) {
	requireRealNode(t)
	node := startRealNode(t)
	uninstallOnCleanup(t, t.Context(), helmBin(t))
	steps := []struct {
		name string
		run  func(*testing.T, *realNode)
	}{
		{"Install", testInstall},
		{"TemplateClaim", testTemplateClaimContainer},
		{"ExtendedResource", testExtendedResourceContainer},
		{"SimulatorAgrees", testSimulatorAgrees},
		{"DemoSpecs", testDemoSpecsOnRealNode},
		{"SharingTools", testSharingTools},
		{"MPSCaps", testMPSCaps},
		{"UseAndIdlePolicy", testUseAndIdlePolicy},
		{"RealDriverTools", testRealDriverTools},
		{"RealNVMLStopsCleanly", testRealNVMLStopsCleanly},
		{"DeviceHealth", testDeviceHealth},
		{"MIGHealth", testMIGHealth},
		{"Drain", testDrain},
		{"TwoControllerReplicas", testTwoControllerReplicas},
		{"ForeignClaimsDuringOutage", testForeignClaimsDuringOutage},
		{"CertificateRenewal", testCertificateRenewal},
		{"ControllerLeastPrivilege", testControllerLeastPrivilege},
		{"MetricsNeedAuthorization", testMetricsNeedAuthorization},
		{"NamespaceLabelsProtected", testNamespaceLabelsProtected},
		{"UpgradeRollsPlugin", testUpgradeRollsPlugin},
		{"Uninstall", testUninstall},
		{"Reinstall", testReinstall},
	}
	for _, s := range steps {
		if !t.Run(s.name, func(t *testing.T) { s.run(t, node) }) {
			t.Fatalf("%s failed; later steps build on it", s.name)
		}
	}
}

// requireRealNode skips (fails under E2E_REQUIRED=1) where a real node
// cannot run: not root, or the binaries not built.
func requireRealNode(t testing.TB) {
	t.Helper()
	reason := framework.RealNodeUnavailable(cp.BinDir)
	if reason == "" {
		return
	}
	if framework.Required() {
		t.Fatalf("%s (E2E_REQUIRED=1)", reason)
	}
	t.Skip(reason)
}

// startRealNode starts the suite's real node; options change what it is
// started with.
func startRealNode(t testing.TB, options ...func(*framework.RealNodeOptions)) *realNode {
	t.Helper()
	ctx := framework.Context(t, 10*time.Minute)
	images, err := framework.BuildNodeImages(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	opts := framework.RealNodeOptions{Name: realNodeName, Images: images}
	if realNodeOnSimulatedLibrary() {
		options = append([]func(*framework.RealNodeOptions){onSimulatedLibrary(t)}, options...)
	}
	for _, o := range options {
		o(&opts)
	}
	if opts.NVMLLibrary != "" {
		t.Logf("real node on --nvml real with the simulated NVML library %s", opts.NVMLLibrary)
	}
	rn, err := cp.StartRealNode(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	stopAtCleanup(t, ctx, rn)
	return &realNode{RealNode: rn}
}

// stopAtCleanup stops the real node when the test ends, with the
// kubelet's last lines if it failed; ctx's values, not its end, reach
// the stop.
func stopAtCleanup(t testing.TB, ctx context.Context, rn *framework.RealNode) {
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("kubelet log %s:\n%s", rn.Kubelet.LogPath, rn.Kubelet.Tail(30))
		}
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
		defer cancel()
		if err := rn.Stop(ctx); err != nil {
			t.Errorf("stopping the real node: %v", err)
		}
	})
}

// realNodeNVMLEnv set to "mock" makes the real node's plugin run the
// in-process mock (--nvml mock:dgxh100). By default ("" or "simulated")
// it runs the production NVML path, --nvml real, on the simulated library
// (hack/nvmlshim) in its driver root: go-nvml's dlopen and cgo calls, as
// on a GPU node (issue 37).
const realNodeNVMLEnv = "E2E_REAL_NODE_NVML"

// onSimulatedLibrary is a startRealNode option: the node's plugin runs
// --nvml real on the simulated library, built (or taken from its cache)
// now.
func onSimulatedLibrary(t testing.TB) func(*framework.RealNodeOptions) {
	t.Helper()
	lib, took, err := shimbuild.Library(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	if took > 0 {
		t.Logf("built the simulated NVML library in %s", took.Round(time.Second))
	}
	return func(o *framework.RealNodeOptions) { o.NVMLLibrary = lib }
}

// onInProcessMock is a startRealNode option: the node's plugin runs the
// in-process mock whatever realNodeNVMLEnv says, for a test that needs
// what only the mock simulates.
func onInProcessMock(o *framework.RealNodeOptions) { o.NVMLLibrary = "" }

// realNodeOnSimulatedLibrary says whether the real node's plugin runs
// --nvml real on the simulated library (realNodeNVMLEnv).
func realNodeOnSimulatedLibrary() bool { return os.Getenv(realNodeNVMLEnv) != "mock" }

// helmOnCluster runs helm against the e2e control plane.
// uninstallOnCleanup removes the suite's release when the test ends,
// whether or not the test got as far as its own uninstall. Call it before
// the install: an install that fails half-way leaves a release too.
func uninstallOnCleanup(t testing.TB, ctx context.Context, helm string) {
	t.Helper()
	t.Cleanup(func() {
		// ctx has ended by now; its values have not.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 4*time.Minute)
		defer cancel()
		if err := cp.UninstallChart(ctx, helm, releaseName, releaseNamespace); err != nil {
			t.Errorf("uninstalling the chart: %v", err)
		}
	})
}

func helmOnCluster(t *testing.T, args ...string) {
	t.Helper()
	if _, err := cp.Helm(framework.Context(t, 3*time.Minute), helmBin(t), args...); err != nil {
		t.Fatal(err)
	}
}

func testInstall(t *testing.T, n *realNode) {
	ctx := framework.Context(t, 5*time.Minute)
	values, err := n.ChartValues(4)
	if err != nil {
		t.Fatal(err)
	}
	n.values = values
	if err := n.InstallChart(ctx, helmBin(t), releaseName, releaseNamespace, values); err != nil {
		t.Fatal(err)
	}
	plugin := waitForPluginPod(t, ctx, "")
	devices, err := n.WaitForDevices(ctx, 8)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("plugin pod %s on %s published %d devices", plugin.Name, plugin.Spec.NodeName, len(devices))
}

// waitForPluginPod waits for the one ready plugin pod on the node that is
// not old (after a rollout: the new one).
func waitForPluginPod(t *testing.T, ctx context.Context, old types.UID) *v1.Pod {
	t.Helper()
	pod, err := cp.WaitForPluginPod(ctx, releaseNamespace, old)
	if err != nil {
		t.Fatal(err)
	}
	return pod
}

// deviceAttrs maps device names to devices.
func deviceAttrs(devices []resourceapi.Device) map[string]resourceapi.Device {
	m := make(map[string]resourceapi.Device, len(devices))
	for _, d := range devices {
		m[d.Name] = d
	}
	return m
}

func stringAttr(d resourceapi.Device, name string) string {
	if a, ok := d.Attributes[resourceapi.QualifiedName(name)]; ok && a.StringValue != nil {
		return *a.StringValue
	}
	return ""
}

func intAttr(d resourceapi.Device, name string) (int64, bool) {
	if a, ok := d.Attributes[resourceapi.QualifiedName(name)]; ok && a.IntValue != nil {
		return *a.IntValue, true
	}
	return 0, false
}

// workloadPod is a pod running the gpuinfo workload on the real node.
func workloadPod(namespace, name string) *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: v1.PodSpec{
			NodeName:                      "",
			HostNetwork:                   true,
			TerminationGracePeriodSeconds: ptr.To[int64](5),
			Containers: []v1.Container{{
				Name: "ctr", Image: framework.WorkloadImage, ImagePullPolicy: v1.PullNever,
			}},
		},
	}
}

func testTemplateClaimContainer(t *testing.T, n *realNode) {
	ctx := framework.Context(t, 3*time.Minute)
	ns := cp.CreateNamespace(t, "real-template")
	createOneGPUTemplate(t, ctx, ns)
	runTemplatePod(t, ctx, n, ns, "template", "one-gpu")
}

// createOneGPUTemplate creates the claim template one-gpu in ns: one whole
// GPU.
func createOneGPUTemplate(t *testing.T, ctx context.Context, ns string) {
	t.Helper()
	if _, err := cp.Client.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, templateFor("one-gpu", ns, "gpu.gpuaas.io"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// templateWorkloadPod is the gpuinfo workload with one claim from a
// template.
func templateWorkloadPod(ns, name, template string) *v1.Pod {
	pod := workloadPod(ns, name)
	pod.Spec.ResourceClaims = []v1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptr.To(template)}}
	pod.Spec.Containers[0].Resources.Claims = []v1.ResourceClaim{{Name: "gpu"}}
	return pod
}

// runTemplatePod runs the gpuinfo workload with one claim from a template
// and checks what its container saw.
func runTemplatePod(t *testing.T, ctx context.Context, n *realNode, ns, name, template string) *v1.Pod {
	t.Helper()
	pod := createAndRun(t, ctx, templateWorkloadPod(ns, name, template))
	checkContainerSawClaims(t, ctx, n, pod, "ctr")
	return pod
}

// testExtendedResourceContainer runs demo/extended-resource: a pod asking
// for nvidia.com/gpu: 1, which a DeviceClass maps to our whole GPUs. The
// scheduler allocates a claim for it and the real kubelet must prepare it
// (the simulator once ran such pods without preparing anything).
func testExtendedResourceContainer(t *testing.T, n *realNode) {
	file := filepath.Join(repoRoot, "demo", "extended-resource", "extended-resource.yaml")
	pods := runSpecOnRealNode(t, t, n, file)
	if !suiteShape(t).extendedResource {
		checkExtendedResourceDropped(t, file, pods)
		return
	}
	if len(pods) != 1 {
		t.Fatalf("%s runs %d pods, want 1", file, len(pods))
	}
	if pods[0].Status.ExtendedResourceClaimStatus == nil {
		t.Fatalf("pod %s has no extendedResourceClaimStatus: %s was not satisfied through DRA", pods[0].Name, extendedResource)
	}
}

// checkExtendedResourceDropped: where DRAExtendedResource is off, the API
// server stores the spec's DeviceClass without its extendedResourceName, as
// a user reads it back, and the pod written for the device-plugin world
// waits (runSpecOnRealNode checked it is unschedulable) instead of running
// on a GPU no claim accounts for.
func checkExtendedResourceDropped(t *testing.T, file string, running []*v1.Pod) {
	t.Helper()
	if len(running) != 0 {
		t.Fatalf("%s runs %d pods where extended resources are not served by DRA", file, len(running))
	}
	ctx := framework.Context(t, time.Minute)
	for _, obj := range readWorkloadSpec(t, file) {
		if obj.GetKind() != "DeviceClass" {
			continue
		}
		class, err := cp.Client.ResourceV1().DeviceClasses().Get(ctx, obj.GetName(), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if class.Spec.ExtendedResourceName != nil {
			t.Fatalf("DeviceClass %s kept extendedResourceName %q, but this version's matrix case drops it", class.Name, *class.Spec.ExtendedResourceName)
		}
		t.Logf("DeviceClass %s stored without its extendedResourceName (DRAExtendedResource off)", class.Name)
	}
}

// createAndRun creates a pod and waits until it runs.
func createAndRun(t *testing.T, ctx context.Context, pod *v1.Pod) *v1.Pod {
	t.Helper()
	if _, err := cp.Client.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating pod %s: %v", pod.Name, err)
	}
	return runningPod(t, ctx, pod.Namespace, pod.Name)
}

// allClaims returns a pod's claims: those of spec.resourceClaims and its
// extended-resource claim.
func allClaims(t *testing.T, ctx context.Context, pod *v1.Pod) []*resourceapi.ResourceClaim {
	t.Helper()
	claims := podClaims(t, ctx, pod)
	if st := pod.Status.ExtendedResourceClaimStatus; st != nil {
		c, err := cp.Client.ResourceV1().ResourceClaims(pod.Namespace).Get(ctx, st.ResourceClaimName, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("extended-resource claim of %s: %v", pod.Name, err)
		}
		claims = append(claims, c)
	}
	return claims
}

// containerDevices returns the devices allocated to one container of a pod:
// those of the claims (and requests) it names, and of the requests its
// extended resources map to.
// usedDevice is one allocated device a container uses, and its claim.
type usedDevice struct {
	claim  *resourceapi.ResourceClaim
	result resourceapi.DeviceRequestAllocationResult
}

func containerDevices(t *testing.T, ctx context.Context, pod *v1.Pod, container string) []usedDevice {
	t.Helper()
	var ctr *v1.Container
	for i := range pod.Spec.Containers {
		if pod.Spec.Containers[i].Name == container {
			ctr = &pod.Spec.Containers[i]
		}
	}
	if ctr == nil {
		t.Fatalf("pod %s has no container %s", pod.Name, container)
	}
	var out []usedDevice
	for _, claim := range allClaims(t, ctx, pod) {
		if claim.Status.Allocation == nil {
			t.Fatalf("claim %s of pod %s not allocated", claim.Name, pod.Name)
		}
		for _, r := range claim.Status.Allocation.Devices.Results {
			if usesRequest(pod, ctr, claim, r.Request) {
				out = append(out, usedDevice{claim: claim, result: r})
			}
		}
	}
	return out
}

// usesRequest reports whether a container uses a request of a claim.
func usesRequest(pod *v1.Pod, ctr *v1.Container, claim *resourceapi.ResourceClaim, request string) bool {
	if st := pod.Status.ExtendedResourceClaimStatus; st != nil && st.ResourceClaimName == claim.Name {
		for _, m := range st.RequestMappings {
			if m.ContainerName == ctr.Name && m.RequestName == request {
				return true
			}
		}
		return false
	}
	for _, c := range ctr.Resources.Claims {
		for i := range pod.Spec.ResourceClaims {
			pc := &pod.Spec.ResourceClaims[i]
			if name, _, err := resourceclaim.Name(pod, pc); pc.Name != c.Name || err != nil || name == nil || *name != claim.Name {
				continue
			}
			// "request" may name a subrequest's parent (firstAvailable).
			if c.Request == "" || c.Request == request || strings.HasPrefix(request, c.Request+"/") {
				return true
			}
		}
	}
	return false
}

// checkContainerSawClaims reads what the container printed and checks it
// saw exactly its devices: the GPUAAS_DEVICE_* variables the plugin wrote
// for them in the CDI specs of their claims (one per device, the UUIDs of
// dynamic MIG devices created at prepare included; NVIDIA_VISIBLE_DEVICES
// is "void" in every spec), the /dev/nvidiaN of its own devices' GPUs,
// nvidiactl, and no other GPU's node.
func checkContainerSawClaims(t *testing.T, ctx context.Context, n *realNode, pod *v1.Pod, container string) {
	t.Helper()
	log, err := n.WaitForPodLog(ctx, pod.Namespace, pod.Name, container, "gpuinfo done")
	if err != nil {
		t.Fatal(err)
	}
	devices, err := cp.PoolDevices(ctx, n.Name)
	if err != nil || devices == nil {
		t.Fatalf("reading the node's devices: %v", err)
	}
	attrs := deviceAttrs(devices)
	wantUUIDs, wantNodes := sets.New[string](), sets.New("/dev/nvidiactl")
	mpsChecked := sets.New[string]()
	for _, u := range containerDevices(t, ctx, pod, container) {
		if !mpsChecked.Has(u.claim.Name) {
			mpsChecked.Insert(u.claim.Name)
			checkMPSClientView(t, n, u.claim, log)
		}
		wantUUIDs = wantUUIDs.Union(specUUIDs(t, n, u.claim, u.result.Device))
		d, ok := attrs[u.result.Device]
		if !ok {
			t.Fatalf("allocated device %s not in the node's slices", u.result.Device)
		}
		if uuid := stringAttr(d, "uuid"); uuid != "" && !wantUUIDs.Has(uuid) {
			t.Errorf("the CDI spec of claim %s does not name device %s (%s)", u.claim.Name, d.Name, uuid)
		}
		wantNodes.Insert(fmt.Sprintf("/dev/nvidia%d", gpuIndex(t, devices, d)))
	}
	gotUUIDs, gotNodes := parseGPUInfo(log)
	if !gotUUIDs.Equal(wantUUIDs) {
		t.Errorf("pod %s container %s: GPUAAS_DEVICE_* name %v, want %v\n%s", pod.Name, container, sets.List(gotUUIDs), sets.List(wantUUIDs), log)
	}
	for node := range wantNodes {
		if !gotNodes.Has(node) {
			t.Errorf("pod %s container %s: no %s\n%s", pod.Name, container, node, log)
		}
	}
	for node := range gotNodes {
		if isGPUNode(node) && !wantNodes.Has(node) {
			t.Errorf("pod %s container %s sees %s, which is not its GPU\n%s", pod.Name, container, node, log)
		}
	}
	checkCUDAProbe(t, fmt.Sprintf("pod %s container %s", pod.Name, container), log, len(wantNodes) > 1)
	t.Logf("pod %s container %s saw %v and %v", pod.Name, container, sets.List(gotUUIDs), sets.List(gotNodes))
}

// gpuIndex is the index of the GPU a device lives on: its own index
// attribute, or its parent GPU's (MIG devices).
func gpuIndex(t *testing.T, devices []resourceapi.Device, d resourceapi.Device) int64 {
	t.Helper()
	if idx, ok := intAttr(d, "index"); ok {
		return idx
	}
	parent := stringAttr(d, "parentUUID")
	for _, g := range devices {
		if stringAttr(g, "type") == "gpu" && stringAttr(g, "uuid") == parent {
			if idx, ok := intAttr(g, "index"); ok {
				return idx
			}
		}
	}
	t.Fatalf("device %s has no index and no parent GPU with one", d.Name)
	return -1
}

// specDeviceEnv reads the device-level environment of every CDI device in
// the spec the plugin wrote for a claim, by CDI device name.
func specDeviceEnv(t *testing.T, n *realNode, claim *resourceapi.ResourceClaim) map[string][]string {
	t.Helper()
	var spec struct {
		Devices []struct {
			Name           string `json:"name"`
			ContainerEdits struct {
				Env []string `json:"env"`
			} `json:"containerEdits"`
		} `json:"devices"`
	}
	if err := json.Unmarshal([]byte(readFile(t, n.CDISpecPath(claim.UID))), &spec); err != nil {
		t.Fatalf("CDI spec of claim %s: %v", claim.Name, err)
	}
	env := map[string][]string{}
	for _, d := range spec.Devices {
		env[d.Name] = d.ContainerEdits.Env
	}
	return env
}

// specUUIDs reads the UUID the CDI spec the plugin wrote for a claim gives
// one of its devices: the device-level GPUAAS_DEVICE_* variable of the CDI
// device <claim UID>-<device>.
func specUUIDs(t *testing.T, n *realNode, claim *resourceapi.ResourceClaim, device string) sets.Set[string] {
	t.Helper()
	uuids := sets.New[string]()
	for _, e := range specDeviceEnv(t, n, claim)[string(claim.UID)+"-"+device] {
		if k, v, _ := strings.Cut(e, "="); strings.HasPrefix(k, "GPUAAS_DEVICE_") {
			uuids.Insert(v)
		}
	}
	if len(uuids) == 0 {
		t.Fatalf("CDI spec of claim %s names no UUID for device %s", claim.Name, device)
	}
	return uuids
}

// parseGPUInfo reads gpuinfo's report: the UUIDs of the GPUAAS_DEVICE_*
// variables and the device nodes.
func parseGPUInfo(log string) (uuids, nodes sets.Set[string]) {
	uuids, nodes = sets.New[string](), sets.New[string]()
	for _, line := range strings.Split(log, "\n") {
		if kv, ok := strings.CutPrefix(line, "env GPUAAS_DEVICE_"); ok {
			if _, v, _ := strings.Cut(kv, "="); v != "" {
				uuids.Insert(v)
			}
		}
		if rest, ok := strings.CutPrefix(line, "dev "); ok {
			nodes.Insert(strings.Fields(rest)[0])
		}
	}
	return uuids, nodes
}

// isGPUNode reports whether a path is /dev/nvidia<N>.
func isGPUNode(path string) bool {
	rest, ok := strings.CutPrefix(path, "/dev/nvidia")
	if !ok || rest == "" {
		return false
	}
	return strings.Trim(rest, "0123456789") == ""
}

// waitGone waits until path no longer exists.
func waitGone(ctx context.Context, path string) error {
	return wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(context.Context) (bool, error) {
		_, err := os.Stat(path)
		return errors.Is(err, os.ErrNotExist), nil
	})
}

// deletePodAndWait deletes a pod and waits until it is gone.
func deletePodAndWait(t *testing.T, ctx context.Context, pod *v1.Pod) {
	t.Helper()
	err := cp.Client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	if err := cp.WaitForPodGone(ctx, pod.Namespace, pod.Name); err != nil {
		t.Fatal(err)
	}
}
