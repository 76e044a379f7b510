package e2e

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

// testDemoSpecsOnRealNode applies every demo spec, with each pod's image
// replaced by the gpuinfo workload, and checks what every container saw.
// The specs stay applied together until the step ends, as in `make demo`.
func testDemoSpecsOnRealNode(t *testing.T, n *realNode) {
	specs := filepath.Join(repoRoot, "demo", "specs")
	files, err := framework.YAMLFiles(specs)
	if err != nil {
		t.Fatal(err)
	}
	for _, file := range files {
		rel, _ := filepath.Rel(specs, file)
		if !t.Run(rel, func(sub *testing.T) { runSpecOnRealNode(sub, t, n, file) }) {
			return
		}
	}
}

// runSpecOnRealNode applies one spec file (pods running gpuinfo), checks
// what every container saw and returns the running pods. Namespaces the
// file declares are deleted when parent ends.
func runSpecOnRealNode(t, parent *testing.T, n *realNode, file string) []*v1.Pod {
	ctx := framework.Context(t, 3*time.Minute)
	shape := suiteShape(t)
	applied, refused := applySpecRefusing(t, parent, file, readWorkloadSpec(t, file), "real-spec", claimOfUnoffered(shape))
	checkRefusedAsUnoffered(t, refused)
	want := specOutcome(t, file, shape)
	var pods []*v1.Pod
	for _, obj := range applied {
		if obj.GetKind() != "Pod" {
			continue
		}
		if claim, ok := namesRefusedClaim(obj, refused); ok {
			p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: obj.GetNamespace(), Name: obj.GetName()}}
			t.Logf("pod %s stays pending without its refused claim %s: %s", obj.GetName(), claim, stayPending(t, ctx, p, 5*time.Second))
			continue
		}
		if want == outcomeWaitsAllocator && !waitsOrRuns(t, ctx, obj.GetNamespace(), obj.GetName()) {
			continue
		}
		if want == outcomeWaits {
			msg, err := cp.WaitForPodUnschedulable(ctx, obj.GetNamespace(), obj.GetName())
			if err != nil {
				t.Fatalf("on this version the spec's pods should wait (%s): %v", want, err)
			}
			t.Logf("pod %s waits on this version (%s): %s", obj.GetName(), want, msg)
			continue
		}
		pod := runningPod(t, ctx, obj.GetNamespace(), obj.GetName())
		for _, c := range pod.Spec.Containers {
			checkContainerSawClaims(t, ctx, n, pod, c.Name)
		}
		pods = append(pods, pod)
	}
	return pods
}

// claimOfUnoffered picks, where the pool offers no MIG device (no
// partitionable devices: 1.34 and 1.35 by default), the claims that ask
// for a MIG class: the quota prices such a claim as a whole GPU, nothing
// published telling it more, and may refuse it (checkRefusedAsUnoffered).
func claimOfUnoffered(shape storedShape) func(*unstructured.Unstructured) bool {
	if shape.dynamicMIG {
		return nil
	}
	return func(obj *unstructured.Unstructured) bool {
		if obj.GetKind() != "ResourceClaim" {
			return false
		}
		requests, _, _ := unstructured.NestedSlice(obj.Object, "spec", "devices", "requests")
		for _, r := range requests {
			req, _ := r.(map[string]any)
			classes := []string{}
			if c, ok, _ := unstructured.NestedString(req, "exactly", "deviceClassName"); ok {
				classes = append(classes, c)
			}
			subs, _, _ := unstructured.NestedSlice(req, "firstAvailable")
			for _, sub := range subs {
				m, _ := sub.(map[string]any)
				c, _ := m["deviceClassName"].(string)
				classes = append(classes, c)
			}
			for _, c := range classes {
				if c == "mig.gpuaas.io" || strings.HasPrefix(c, "mig-") {
					return true
				}
			}
		}
		return false
	}
}

// checkRefusedAsUnoffered: a claim refused for a class the pool does not
// offer is refused with a message that says its price is a guess.
func checkRefusedAsUnoffered(t *testing.T, refused map[string]string) {
	t.Helper()
	for claim, msg := range refused {
		if !strings.Contains(msg, "no published device matches class") {
			t.Fatalf("claim %s refused without saying that nothing of its class is published: %s", claim, msg)
		}
		t.Logf("claim %s refused, as a class this version does not offer: %s", claim, msg)
	}
}

// namesRefusedClaim reports the refused claim a pod names, if any.
func namesRefusedClaim(pod *unstructured.Unstructured, refused map[string]string) (string, bool) {
	claims, _, _ := unstructured.NestedSlice(pod.Object, "spec", "resourceClaims")
	for _, c := range claims {
		m, _ := c.(map[string]any)
		name, _ := m["resourceClaimName"].(string)
		if key := pod.GetNamespace() + "/" + name; name != "" && refused[key] != "" {
			return key, true
		}
	}
	return "", false
}

// waitsOrRuns waits until the pod runs (true) or is unschedulable (false):
// where the scheduler's allocator refuses a claim depending on which GPU it
// tries first (storedShape.keepsRejectedCounters), either is right.
func waitsOrRuns(t *testing.T, ctx context.Context, namespace, name string) bool {
	t.Helper()
	return waitsOrRunsOn(t, ctx, cp, namespace, name)
}

// waitsOrRunsOn is waitsOrRuns on another control plane.
func waitsOrRunsOn(t *testing.T, ctx context.Context, api *framework.ControlPlane, namespace, name string) bool {
	t.Helper()
	pod, err := api.WaitForPod(ctx, namespace, name, "running or unschedulable", func(p *v1.Pod) bool {
		return p.Status.Phase == v1.PodRunning || slices.ContainsFunc(p.Status.Conditions, func(c v1.PodCondition) bool {
			return c.Type == v1.PodScheduled && c.Status == v1.ConditionFalse && c.Reason == v1.PodReasonUnschedulable
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	runs := pod.Status.Phase == v1.PodRunning
	t.Logf("pod %s/%s, which this version's allocator may refuse: running %v", namespace, name, runs)
	return runs
}

// specOutcome is what a demo spec's pods get on a cluster whose stored pool
// and scheduler are shape: the version matrix's outcomes, read from the
// classes the spec asks for (issue 35).
func specOutcome(t *testing.T, file string, shape storedShape) outcome {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	spec := string(data)
	switch {
	case strings.Contains(spec, "deviceClassName: shared.gpuaas.io") && !shape.shares:
		return outcomeWaits
	case (strings.Contains(spec, "deviceClassName: mig.gpuaas.io") || strings.Contains(spec, "deviceClassName: mig-")) && !shape.dynamicMIG:
		return outcomeWaits // the real node's MIG is GPUs 6 and 7, dynamic
	case strings.Contains(spec, extendedResource+": ") && !shape.extendedResource:
		return outcomeWaits // the API server dropped the class's extendedResourceName
	case strings.Contains(spec, "matchAttribute: gpu.gpuaas.io/parentUUID") && shape.keepsRejectedCounters:
		return outcomeWaitsAllocator
	}
	return outcomeRuns
}

// suiteShape is the version matrix's case of the suite's own control plane
// (E2E_SUITE_K8S, E2E_SUITE_GATES; make test-versions runs the real node on
// each), by default the newest version with its default gates.
func suiteShape(t *testing.T) storedShape {
	t.Helper()
	return suiteCase(t).want
}

// suiteCase is the version matrix's case of the suite's own control plane
// (or the next minor's, make test-next).
func suiteCase(t *testing.T) apiServerCase {
	t.Helper()
	version, gates := os.Getenv(framework.SuiteVersionEnv), framework.SuiteGates()
	for _, c := range slices.Concat(apiServerCases, nextVersionCases) {
		if c.version == version && c.gates == gates {
			return c
		}
	}
	t.Fatalf("no case of the version matrix for %s=%q %s=%q", framework.SuiteVersionEnv, version, framework.SuiteGatesEnv, gates)
	return apiServerCase{}
}

// readWorkloadSpec reads a spec file's objects, with each pod's image
// replaced by the gpuinfo workload.
func readWorkloadSpec(t *testing.T, file string) []*unstructured.Unstructured {
	t.Helper()
	objs, err := framework.ReadObjects(file)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if o.GetKind() == "Pod" {
			if err := framework.UseWorkloadImage(o); err != nil {
				t.Fatal(err)
			}
		}
	}
	return objs
}

// testUpgradeRollsPlugin prepares a claim with the installed plugin pod,
// upgrades the release (a changed pod template rolls the DaemonSet with
// maxSurge: the new pod starts next to the old one under POD_UID), and
// checks that the new pod unprepares what the old one prepared.
func testUpgradeRollsPlugin(t *testing.T, n *realNode) {
	ctx := framework.Context(t, 5*time.Minute)
	old := waitForPluginPod(t, ctx, "")
	checkLivenessHeld(t, ctx, old)
	old = waitForPluginPod(t, ctx, "")
	for _, st := range old.Status.ContainerStatuses {
		if st.RestartCount != 0 {
			t.Errorf("plugin container %s restarted %d times (liveness probe?); last state %+v", st.Name, st.RestartCount, st.LastTerminationState)
		}
	}
	ns := cp.CreateNamespace(t, "real-upgrade")
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "kept", Namespace: ns},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu.gpuaas.io"}}},
		}},
	}
	claim, err := cp.Client.ResourceV1().ResourceClaims(ns).Create(ctx, claim, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod := workloadPod(ns, "before-upgrade")
	pod.Spec.ResourceClaims = []v1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To("kept")}}
	pod.Spec.Containers[0].Resources.Claims = []v1.ResourceClaim{{Name: "gpu"}}
	pod = createAndRun(t, ctx, pod)
	for _, path := range []string{n.CDISpecPath(claim.UID), n.CheckpointPath(claim.UID)} {
		if _, err := os.Stat(path); err != nil {
			t.Fatalf("old plugin pod did not prepare claim: %v", err)
		}
	}
	// The upgrade also moves the driver root to the GPU Operator's layout
	// (the driver container's root at /run/nvidia/driver).
	operatorRoot, err := n.OperatorDriverRoot(ctx, 8)
	if err != nil {
		t.Fatal(err)
	}
	n.values = strings.Replace(n.values, "logVerbosity: 4", "logVerbosity: 5", 1)
	n.values = strings.Replace(n.values, "driverRoot: "+n.DriverRoot+"\n", "driverRoot: "+operatorRoot+"\n", 1)
	file, err := n.WriteValues("values-upgrade.yaml", n.values)
	if err != nil {
		t.Fatal(err)
	}
	helmOnCluster(t, "upgrade", releaseName, chartPath, "--namespace", releaseNamespace, "-f", file)
	fresh := waitForPluginPod(t, ctx, old.UID)
	t.Logf("plugin rolled from %s to %s", old.Name, fresh.Name)
	n.DriverRoot = operatorRoot
	checkOperatorDriverRoot(t, ctx, n, ns)
	deletePodAndWait(t, ctx, pod)
	for _, path := range []string{n.CDISpecPath(claim.UID), n.CheckpointPath(claim.UID)} {
		if err := waitGone(ctx, path); err != nil {
			t.Errorf("the new plugin pod did not unprepare the old one's claim: %s still there: %v", path, err)
		}
	}
}

// livenessWindow is longer than the chart's probe takes to kill a plugin
// whose health check fails: first probe after 10 s, then every 10 s, three
// failures in a row.
const livenessWindow = 45 * time.Second

// checkLivenessHeld waits until the plugin container has run for longer
// than a failing liveness probe would let it (the probe once checked a
// socket that does not exist under POD_UID), for the caller to check it
// was never restarted.
func checkLivenessHeld(t *testing.T, ctx context.Context, pod *v1.Pod) {
	t.Helper()
	for _, st := range pod.Status.ContainerStatuses {
		if st.State.Running == nil {
			t.Fatalf("plugin container %s not running: %+v", st.Name, st.State)
		}
		if left := time.Until(st.State.Running.StartedAt.Add(livenessWindow)); left > 0 {
			t.Logf("waiting %s for the plugin's liveness probe to have had its chances", left.Round(time.Second))
			select {
			case <-time.After(left):
			case <-ctx.Done():
				t.Fatal(ctx.Err())
			}
		}
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// testUninstall removes the release and checks that nothing of ours is
// left: no pods, no webhook configuration that could block claims, no
// ResourceSlices, no CDI specs; and that claims can still be created.
func testUninstall(t *testing.T, n *realNode) {
	ctx := framework.Context(t, 4*time.Minute)
	helmOnCluster(t, "uninstall", releaseName, "--namespace", releaseNamespace, "--wait", "--timeout", "2m")
	if err := cp.WaitForNoPods(ctx, releaseNamespace); err != nil {
		t.Errorf("pods of the release still there: %v", err)
	}
	hooks, err := cp.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range hooks.Items {
		if strings.Contains(h.Name, releaseName) {
			t.Errorf("validating webhook configuration %s left behind", h.Name)
		}
	}
	mutating, err := cp.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range mutating.Items {
		if strings.Contains(h.Name, releaseName) {
			t.Errorf("mutating webhook configuration %s left behind", h.Name)
		}
	}
	// Another driver's claim (and ours) must still be admitted.
	ns := cp.CreateNamespace(t, "after-uninstall")
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "other-driver", Namespace: ns},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{Name: "dev", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu.gpuaas.io"}}},
		}},
	}
	if _, err := cp.Client.ResourceV1().ResourceClaims(ns).Create(ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Errorf("creating a claim after uninstall: %v", err)
	}
	err = wait.PollUntilContextCancel(ctx, time.Second, true, func(ctx context.Context) (bool, error) {
		list, err := cp.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{
			FieldSelector: resourceapi.ResourceSliceSelectorDriver + "=" + framework.DriverName})
		return err == nil && len(list.Items) == 0, nil
	})
	if err != nil {
		t.Errorf("ResourceSlices of %s still published after uninstall: %v", n.Name, err)
	}
	specs, _ := filepath.Glob(filepath.Join(n.CDIRoot, "k8s."+framework.DriverName+"-*"))
	if len(specs) > 0 {
		t.Errorf("CDI specs left behind: %v", specs)
	}
	// Every claim is gone, so no MIG device may be left on the simulated
	// GPUs, whose state outlived every plugin pod of the release (the
	// node configuration has no static MIG).
	if left := mockMIGDevices(t, n); left > 0 {
		t.Errorf("%d MIG devices left on the GPUs after every claim was unprepared", left)
	}
}

// mockMIGDevices counts the GPU instances in the simulated machine's state
// file, which the chart keeps in the plugin's host directory.
func mockMIGDevices(t *testing.T, n *realNode) int {
	t.Helper()
	gis, _ := mockMachineLeaks(t, filepath.Join(n.KubeletDir, "plugins", framework.DriverName, "mock-nvml"))
	return gis
}

// testReinstall installs the release again after the uninstall: nothing
// left behind may refuse it (a webhook configuration the controller once
// created outlived the release and refused the new release's own
// GpuProfiles), and the plugin publishes again. This release brings a
// GpuProfile of its own (the demo specs' profiles, not Helm's, hold the
// default names), which must pass the catalog webhook.
func testReinstall(t *testing.T, n *realNode) {
	ctx := framework.Context(t, 5*time.Minute)
	values := strings.Replace(n.values, "gpuProfiles: {gpu: null, mig-1g: null}", `gpuProfiles:
  gpu: null
  mig-1g: null
  reinstalled-gpu:
    displayName: Whole GPU
    selector: {type: gpu}`, 1)
	if err := n.InstallChart(ctx, helmBin(t), releaseName, releaseNamespace, values); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"reinstalled-gpu"} {
		err := wait.PollUntilContextCancel(ctx, 500*time.Millisecond, true, func(ctx context.Context) (bool, error) {
			_, err := cp.Client.ResourceV1().DeviceClasses().Get(ctx, name, metav1.GetOptions{})
			return err == nil, nil
		})
		if err != nil {
			t.Errorf("the reinstalled controller did not render GpuProfile %s into a DeviceClass: %v", name, err)
		}
	}
	helmOnCluster(t, "uninstall", releaseName, "--namespace", releaseNamespace, "--wait", "--timeout", "2m")
	// The controller's drain finalizer must not outlive it: the uninstall
	// hook releases the profile, so helm's delete removes it and its class.
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, perr := cp.Dynamic.Resource(gpuProfileGVR).Get(ctx, "reinstalled-gpu", metav1.GetOptions{})
		_, cerr := cp.Client.ResourceV1().DeviceClasses().Get(ctx, "reinstalled-gpu", metav1.GetOptions{})
		return apierrors.IsNotFound(perr) && apierrors.IsNotFound(cerr), nil
	})
	if err != nil {
		p, _ := cp.Dynamic.Resource(gpuProfileGVR).Get(ctx, "reinstalled-gpu", metav1.GetOptions{})
		t.Errorf("GpuProfile reinstalled-gpu or its DeviceClass left after helm uninstall: %v (finalizers %v)", err, p.GetFinalizers())
	}
}

var gpuProfileGVR = schema.GroupVersionResource{Group: "gpuaas.io", Version: "v1alpha1", Resource: "gpuprofiles"}
