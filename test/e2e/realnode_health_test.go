package e2e

// Device health on the real node: faults injected into the node's mock
// machine (as mocknvml does, through the state directory the chart gives
// the plugin) must reach the scheduler as device taints, the kubelet as
// device health, and the claim as device status; and clear again.

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"

	"github.com/gpuaas/gpu-dra-driver/pkg/health"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev/nvmock"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin"
	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

// healthClass selects any of our devices; each claim narrows it with a
// selector of its own.
const healthClass = "health-any.gpuaas.io"

// healthRun is one health step's fixtures.
type healthRun struct {
	n        *realNode
	ns       string
	stateDir string
}

func newHealthRun(t *testing.T, n *realNode) *healthRun {
	t.Helper()
	ns := cp.CreateNamespace(t, "real-health")
	ctx := framework.Context(t, time.Minute)
	class := &resourceapi.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: healthClass},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
			Expression: fmt.Sprintf("device.driver == %q", framework.DriverName)}}}},
	}
	if _, err := cp.Client.ResourceV1().DeviceClasses().Create(ctx, class, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cp.Client.ResourceV1().DeviceClasses().Delete(context.Background(), healthClass, metav1.DeleteOptions{})
	})
	return &healthRun{n: n, ns: ns,
		stateDir: filepath.Join(n.KubeletDir, "plugins", framework.DriverName, "mock-nvml")}
}

// pod makes a workload pod with one claim of one device matching cel; the
// pod's reference to its claim is named "gpu", the claim like the pod.
func (h *healthRun) pod(t *testing.T, ctx context.Context, name, cel string) *v1.Pod {
	t.Helper()
	return h.podWithClaim(t, ctx, name, "gpu", cel)
}

// podWithClaim is pod with the pod's reference to its claim named ref.
func (h *healthRun) podWithClaim(t *testing.T, ctx context.Context, name, ref, cel string) *v1.Pod {
	t.Helper()
	claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: h.ns}, Spec: oneDeviceOf(cel)}
	if _, err := cp.Client.ResourceV1().ResourceClaims(h.ns).Create(ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := workloadPod(h.ns, name)
	pod.Spec.ResourceClaims = []v1.PodResourceClaim{{Name: ref, ResourceClaimName: ptr.To(name)}}
	pod.Spec.Containers[0].Resources.Claims = []v1.ResourceClaim{{Name: ref}}
	if _, err := cp.Client.CoreV1().Pods(h.ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return pod
}

// oneDeviceOf is a claim for one device of the health class matching cel.
func oneDeviceOf(cel string) resourceapi.ResourceClaimSpec {
	return resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
		Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: healthClass,
			Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: cel}}}},
	}}}}
}

// reportedPod is a running pod with one claim of one device matching cel,
// the claim referenced the way this version's kubelet reports device
// health for (kubeletHealth), and the name of that ResourceClaim.
func (h *healthRun) reportedPod(t *testing.T, ctx context.Context, name, cel string, reports kubeletHealth) (*v1.Pod, string) {
	t.Helper()
	switch reports {
	case healthSameName:
		pod := h.podWithClaim(t, ctx, name, name, cel)
		return runningPod(t, ctx, h.ns, pod.Name), name
	case healthTemplateOnly:
		tmpl := &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: h.ns},
			Spec: resourceapi.ResourceClaimTemplateSpec{Spec: oneDeviceOf(cel)}}
		if _, err := cp.Client.ResourceV1().ResourceClaimTemplates(h.ns).Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		pod := workloadPod(h.ns, name)
		pod.Spec.ResourceClaims = []v1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptr.To(name)}}
		pod.Spec.Containers[0].Resources.Claims = []v1.ResourceClaim{{Name: "gpu"}}
		if _, err := cp.Client.CoreV1().Pods(h.ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		pod = runningPod(t, ctx, h.ns, pod.Name)
		for _, st := range pod.Status.ResourceClaimStatuses {
			if st.Name == "gpu" && st.ResourceClaimName != nil {
				return pod, *st.ResourceClaimName
			}
		}
		t.Fatalf("running pod %s names no claim made from template %s: %+v", pod.Name, name, pod.Status.ResourceClaimStatuses)
	}
	pod := h.pod(t, ctx, name, cel)
	return runningPod(t, ctx, h.ns, pod.Name), name
}

// publishedTaints maps each published device of the node to its taint keys.
func publishedTaints(ctx context.Context) (map[string][]string, error) {
	slices, err := cp.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	out := map[string][]string{}
	for _, s := range slices.Items {
		if s.Spec.Driver != framework.DriverName || s.Spec.Pool.Name != realNodeName {
			continue
		}
		for _, d := range s.Spec.Devices {
			keys := []string{}
			for _, taint := range d.Taints {
				keys = append(keys, taint.Key+"="+taint.Value+":"+string(taint.Effect))
			}
			out[d.Name] = keys
		}
	}
	return out, nil
}

// waitTaints waits until cond holds of the devices tainted with key, and
// returns how long that took.
func waitTaints(t *testing.T, ctx context.Context, key, what string, cond func(tainted map[string]bool) bool) time.Duration {
	t.Helper()
	took, last, err := waitDevices(ctx, func(keys []string) bool {
		return slices.ContainsFunc(keys, func(k string) bool { return strings.HasPrefix(k, key+"=") })
	}, cond)
	if err != nil {
		t.Fatalf("waiting for %s: %v; tainted with %s: %v", what, err, key, last)
	}
	return took
}

// waitDevices polls the node's published devices until cond holds of those
// whose taint keys pick, and returns how long that took and the last set.
func waitDevices(ctx context.Context, pick func(keys []string) bool, cond func(picked map[string]bool) bool) (time.Duration, map[string]bool, error) {
	start := time.Now()
	var last map[string]bool
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		taints, err := publishedTaints(ctx)
		if err != nil {
			return false, err
		}
		last = map[string]bool{}
		for dev, keys := range taints {
			if pick(keys) {
				last[dev] = true
			}
		}
		return cond(last), nil
	})
	return time.Since(start), last, err
}

// devicesOfGPU are the published devices whose index attribute is index.
func devicesOfGPU(t *testing.T, ctx context.Context, index int64) map[string]bool {
	t.Helper()
	slices, err := cp.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, s := range slices.Items {
		if s.Spec.Driver != framework.DriverName || s.Spec.Pool.Name != realNodeName {
			continue
		}
		for _, d := range s.Spec.Devices {
			if i, ok := intAttr(d, "index"); ok && i == index {
				out[d.Name] = true
			}
		}
	}
	return out
}

// deviceStatus waits for the claim's status entry of its one device to
// satisfy cond, and returns it with its data.
func deviceStatus(t *testing.T, ctx context.Context, ns, claim, what string, cond func(resourceapi.AllocatedDeviceStatus) bool) (resourceapi.AllocatedDeviceStatus, plugin.DeviceStatusData) {
	t.Helper()
	var got resourceapi.AllocatedDeviceStatus
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		c, err := cp.Client.ResourceV1().ResourceClaims(ns).Get(ctx, claim, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, d := range c.Status.Devices {
			if d.Driver == framework.DriverName {
				got = d
				return cond(d), nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("claim %s: waiting for device status %s: %v; last %+v", claim, what, err, got)
	}
	var data plugin.DeviceStatusData
	if got.Data != nil {
		if err := json.Unmarshal(got.Data.Raw, &data); err != nil {
			t.Fatalf("claim %s: device status data: %v", claim, err)
		}
	}
	return got, data
}

func conditionIs(d resourceapi.AllocatedDeviceStatus, typ string, status metav1.ConditionStatus) bool {
	for _, c := range d.Conditions {
		if c.Type == typ {
			return c.Status == status
		}
	}
	return false
}

// podDeviceHealth waits until the kubelet reports the health of the pod's
// claimed device (allocatedResourcesStatus, KEP-4680) as want.
func podDeviceHealth(t *testing.T, ctx context.Context, pod *v1.Pod, want string) string {
	t.Helper()
	var last string
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := cp.Client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, cs := range p.Status.ContainerStatuses {
			for _, rs := range cs.AllocatedResourcesStatus {
				for _, r := range rs.Resources {
					last = fmt.Sprintf("%s %s %s", rs.Name, r.ResourceID, r.Health)
					if string(r.Health) == want {
						return true, nil
					}
				}
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("pod %s: waiting for device health %s from the kubelet: %v; last %q", pod.Name, want, err, last)
	}
	return last
}

// stayPending checks that a pod is not scheduled for a while, and says why.
func stayPending(t *testing.T, ctx context.Context, pod *v1.Pod, d time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(d)
	var reason string
	for time.Now().Before(deadline) {
		p, err := cp.Client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if p.Spec.NodeName != "" {
			t.Fatalf("pod %s was scheduled to %s", pod.Name, p.Spec.NodeName)
		}
		for _, c := range p.Status.Conditions {
			if c.Type == v1.PodScheduled {
				reason = c.Message
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	return reason
}

// testDeviceHealth: a fatal XID on the time-sliced GPU 4 taints all four of
// its replicas; the running pod's claim and the kubelet report
// its device unhealthy; a new pod asking for a replica is not scheduled
// until the quiet period clears the taint, and then runs on GPU 4.
func testDeviceHealth(t *testing.T, n *realNode) {
	ctx := framework.Context(t, 5*time.Minute)
	h := newHealthRun(t, n)
	replica := `device.attributes["gpu.gpuaas.io"].type == "timeslice"`
	reports, faults := suiteShape(t).kubeletHealth, suiteFaultView(t)
	running, claim := h.reportedPod(t, ctx, "running", replica, reports)
	_, data := deviceStatus(t, ctx, h.ns, claim, "Ready and Healthy", func(d resourceapi.AllocatedDeviceStatus) bool {
		return conditionIs(d, "Ready", metav1.ConditionTrue) && conditionIs(d, "Healthy", metav1.ConditionTrue)
	})
	t.Logf("device status data of the running claim: %+v", data)
	gpu4 := devicesOfGPU(t, ctx, 4)
	if len(gpu4) != 4 {
		t.Fatalf("GPU 4 publishes %v, want 4 replicas", gpu4)
	}

	if err := nvmock.InjectEvent(h.stateDir, data.GPUUUID, nvml.EventTypeXidCriticalError, 62, nvmock.WholeGPU, nvmock.WholeGPU); err != nil {
		t.Fatal(err)
	}
	took := faults.waitFaulted(t, ctx, "gpu.gpuaas.io/xid", "every replica of GPU 4 tainted", gpu4)
	// How fast is the machine's speed as much as ours: logged, not asserted.
	t.Logf("XID 62 on GPU 4: its %d devices kept off (taints kept: %v) after %v", len(gpu4), faults.taints, took)
	st, _ := deviceStatus(t, ctx, h.ns, claim, "Healthy=False", func(d resourceapi.AllocatedDeviceStatus) bool {
		return conditionIs(d, "Healthy", metav1.ConditionFalse)
	})
	t.Logf("claim status: %+v", st.Conditions)
	if reports != healthNone {
		t.Logf("kubelet (%s): %s", reports, podDeviceHealth(t, ctx, running, "Unhealthy"))
	} else {
		t.Logf("kubelet: %s; the claim's Healthy condition says it", reports)
	}
	faults.waitFaultyGPU(t, ctx, 4, gpuaas.PostureUnhealthy)
	if !faults.taints {
		checkGpuNodeNamesGaps(ctx, t, cp, realNodeName, suiteCase(t))
	}

	waiting := h.pod(t, ctx, "waiting", replica)
	t.Logf("new pod while tainted: %s", stayPending(t, ctx, waiting, 5*time.Second))
	took = faults.waitCleared(t, ctx, "gpu.gpuaas.io/xid", "the quiet period to clear the taint", gpu4)
	t.Logf("taint cleared %v later", took)
	runningPod(t, ctx, h.ns, waiting.Name)
	deviceStatus(t, ctx, h.ns, claim, "Healthy again", func(d resourceapi.AllocatedDeviceStatus) bool {
		return conditionIs(d, "Healthy", metav1.ConditionTrue)
	})
	if reports != healthNone {
		podDeviceHealth(t, ctx, running, "Healthy")
	}
	waitGPUPosture(t, ctx, 4, gpuaas.PosturePartiallyAllocated)
	deletePodAndWait(t, ctx, running)
	deletePodAndWait(t, ctx, waiting)

	// A reset-required XID stays until a reset is seen, or an operator
	// clears it (dra-kubelet-plugin --clear-faults in the plugin pod writes
	// this request into the plugin's directory on the host).
	if err := nvmock.InjectEvent(h.stateDir, data.GPUUUID, nvml.EventTypeXidCriticalError, 48, nvmock.WholeGPU, nvmock.WholeGPU); err != nil {
		t.Fatal(err)
	}
	faults.waitFaulted(t, ctx, "gpu.gpuaas.io/xid", "XID 48 (reset-required) tainting GPU 4", gpu4)
	if err := health.RequestClear(filepath.Join(n.KubeletDir, "plugins", framework.DriverName, "health-clear"), data.GPUUUID); err != nil {
		t.Fatal(err)
	}
	took = faults.waitCleared(t, ctx, "gpu.gpuaas.io/xid", "the operator's clear request to remove it", gpu4)
	t.Logf("XID 48 cleared at an operator's request %v later", took)
}

// testMIGHealth: an XID scoped to one MIG device taints that device only,
// and a MIG device NVML refuses to destroy keeps its placement tainted
// until the kubelet's retry of unprepare succeeds.
func testMIGHealth(t *testing.T, n *realNode) {
	ctx := framework.Context(t, 5*time.Minute)
	if !suiteShape(t).dynamicMIG {
		checkNoMIGOffered(t, ctx)
		return
	}
	if !suiteShape(t).taints {
		t.Fatal("dynamic MIG without device taints is no case of the version matrix; this step has no expectations for it")
	}
	h := newHealthRun(t, n)
	pod := h.pod(t, ctx, "mig", `device.attributes["gpu.gpuaas.io"].type == "mig" && device.attributes["gpu.gpuaas.io"].profile == "1g.10gb"`)
	pod = runningPod(t, ctx, h.ns, pod.Name)
	st, data := deviceStatus(t, ctx, h.ns, "mig", "Ready with the MIG device's IDs", func(d resourceapi.AllocatedDeviceStatus) bool {
		return conditionIs(d, "Ready", metav1.ConditionTrue)
	})
	if data.MIGUUID == "" || data.MIGGPUInstanceID == nil || data.MIGPlacement == nil {
		t.Fatalf("device status data lacks the MIG device: %+v", data)
	}
	t.Logf("device status data of the MIG claim: %+v", data)
	device := map[string]bool{st.Device: true}

	if err := nvmock.InjectEvent(h.stateDir, data.GPUUUID, nvml.EventTypeXidCriticalError, 94,
		uint32(*data.MIGGPUInstanceID), uint32(*data.MIGComputeInstanceID)); err != nil {
		t.Fatal(err)
	}
	took := waitTaints(t, ctx, "gpu.gpuaas.io/xid", "only the MIG device tainted", func(got map[string]bool) bool { return maps.Equal(got, device) })
	t.Logf("MIG-scoped XID 94 on %s: only it tainted after %v", st.Device, took)
	waitTaints(t, ctx, "gpu.gpuaas.io/xid", "the quiet period to clear it", func(got map[string]bool) bool { return len(got) == 0 })

	if err := nvmock.SetMigDestroyFails(h.stateDir, data.GPUUUID, true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nvmock.SetMigDestroyFails(h.stateDir, data.GPUUUID, false) })
	if err := cp.Client.CoreV1().Pods(h.ns).Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	took = waitTaints(t, ctx, "gpu.gpuaas.io/cleanup-blocked", "the placement tainted while destroy fails", func(got map[string]bool) bool { return maps.Equal(got, device) })
	t.Logf("MIG destroy refused: %s tainted cleanup-blocked after %v", st.Device, took)
	gpu, ok := intAttr(publishedDevice(t, ctx, st.Device), "index")
	if !ok {
		t.Fatalf("device %s has no index", st.Device)
	}
	waitGPUPosture(t, ctx, int32(gpu), gpuaas.PostureCleanupBlocked)
	if err := nvmock.SetMigDestroyFails(h.stateDir, data.GPUUUID, false); err != nil {
		t.Fatal(err)
	}
	took = waitTaints(t, ctx, "gpu.gpuaas.io/cleanup-blocked", "the kubelet's retry to clear it", func(got map[string]bool) bool { return len(got) == 0 })
	t.Logf("retry succeeded: taint cleared %v later", took)
	if err := cp.WaitForPodGone(ctx, h.ns, pod.Name); err != nil {
		t.Fatal(err)
	}
	if left := mockMIGDevices(t, n); left != 0 {
		t.Fatalf("%d MIG devices left after the retry", left)
	}
}

// testDrain drains the node's GPUs with a DeviceTaintRule, as an admin
// would before maintenance: NoSchedule keeps new claims off while running
// pods keep running; deleting the rule lets the waiting pod in.
func testDrain(t *testing.T, n *realNode) {
	ctx := framework.Context(t, 5*time.Minute)
	h := newHealthRun(t, n)
	whole := `device.attributes["gpu.gpuaas.io"].type == "gpu" && device.attributes["gpu.gpuaas.io"].index < 4`
	running := h.pod(t, ctx, "before-drain", whole)
	running = runningPod(t, ctx, h.ns, running.Name)

	rule := &resourceapi.DeviceTaintRule{
		ObjectMeta: metav1.ObjectMeta{Name: "drain-" + realNodeName},
		Spec: resourceapi.DeviceTaintRuleSpec{
			DeviceSelector: &resourceapi.DeviceTaintSelector{Driver: ptr.To(framework.DriverName), Pool: ptr.To(realNodeName)},
			Taint:          resourceapi.DeviceTaint{Key: "gpu.gpuaas.io/drain", Value: "maintenance", Effect: resourceapi.DeviceTaintEffectNoSchedule},
		},
	}
	if !servesV1DeviceTaintRules(t) {
		// Before 1.37 (E2E_SUITE_K8S): the drain's API is beta or alpha and
		// off by default; admins are told so, and nothing pretends to drain.
		_, err := cp.Client.ResourceV1().DeviceTaintRules().Create(ctx, rule, metav1.CreateOptions{})
		if !apierrors.IsNotFound(err) {
			t.Fatalf("resource.k8s.io/v1 DeviceTaintRules are not in discovery, yet creating one answered %v", err)
		}
		if lines := controllerLogLines(t, n, "DeviceTaintRules are not served"); len(lines) == 0 {
			t.Errorf("the controller does not say that drains are not available here")
		} else {
			t.Logf("no drain on this version: %v; the controller: %s", err, lines[0])
		}
		deletePodAndWait(t, ctx, running)
		return
	}
	if _, err := cp.Client.ResourceV1().DeviceTaintRules().Create(ctx, rule, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cp.Client.ResourceV1().DeviceTaintRules().Delete(context.Background(), rule.Name, metav1.DeleteOptions{})
	})
	waiting := h.pod(t, ctx, "after-drain", whole)
	t.Logf("new pod on the drained node: %s", stayPending(t, ctx, waiting, 5*time.Second))
	for index := range int32(8) {
		waitGPUPosture(t, ctx, index, gpuaas.PostureDraining)
	}
	p, err := cp.Client.CoreV1().Pods(h.ns).Get(ctx, running.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Status.Phase != v1.PodRunning || p.DeletionTimestamp != nil {
		t.Fatalf("running pod %s is %s (deleting: %v) under a NoSchedule drain", p.Name, p.Status.Phase, p.DeletionTimestamp != nil)
	}
	if err := cp.Client.ResourceV1().DeviceTaintRules().Delete(ctx, rule.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	runningPod(t, ctx, h.ns, waiting.Name)
	deletePodAndWait(t, ctx, running)
	deletePodAndWait(t, ctx, waiting)
	testDrainOneGPU(t, ctx, h)
}

// testDrainOneGPU drains GPU 6 (dynamic MIG: 26 devices) as docs/health.md
// says: one DeviceTaintRule per device carrying its index, since a rule
// selects devices by name only. A new MIG claim then lands on GPU 7.
func testDrainOneGPU(t *testing.T, ctx context.Context, h *healthRun) {
	devices := devicesOfGPU(t, ctx, 6)
	for dev := range devices {
		rule := &resourceapi.DeviceTaintRule{
			ObjectMeta: metav1.ObjectMeta{Name: "drain-" + realNodeName + "-" + dev, Labels: map[string]string{"gpu.gpuaas.io/drain": "gpu-6"}},
			Spec: resourceapi.DeviceTaintRuleSpec{
				DeviceSelector: &resourceapi.DeviceTaintSelector{Driver: ptr.To(framework.DriverName), Pool: ptr.To(realNodeName), Device: ptr.To(dev)},
				Taint:          resourceapi.DeviceTaint{Key: "gpu.gpuaas.io/drain", Value: "maintenance", Effect: resourceapi.DeviceTaintEffectNoSchedule},
			},
		}
		if _, err := cp.Client.ResourceV1().DeviceTaintRules().Create(ctx, rule, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		_ = cp.Client.ResourceV1().DeviceTaintRules().DeleteCollection(context.Background(), metav1.DeleteOptions{},
			metav1.ListOptions{LabelSelector: "gpu.gpuaas.io/drain=gpu-6"})
	})
	waitGPUPosture(t, ctx, 6, gpuaas.PostureDraining)
	pod := h.pod(t, ctx, "mig-elsewhere", `device.attributes["gpu.gpuaas.io"].type == "mig" && device.attributes["gpu.gpuaas.io"].profile == "1g.10gb"`)
	runningPod(t, ctx, h.ns, pod.Name)
	st, _ := deviceStatus(t, ctx, h.ns, "mig-elsewhere", "Ready", func(d resourceapi.AllocatedDeviceStatus) bool {
		return conditionIs(d, "Ready", metav1.ConditionTrue)
	})
	if devices[st.Device] {
		t.Fatalf("the new MIG claim got %s, on the drained GPU 6", st.Device)
	}
	t.Logf("GPU 6 drained by %d DeviceTaintRules (one per device); the new MIG claim got %s", len(devices), st.Device)
	deletePodAndWait(t, ctx, pod)
}

// waitGPUPosture waits until the controller reports GPU index of the real
// node in posture want (GpuNode status), and returns its reason.
func waitGPUPosture(t *testing.T, ctx context.Context, index int32, want gpuaas.Posture) string {
	t.Helper()
	c := installCRDs(t)
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var node gpuaas.GpuNode
	var reason string
	err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		if err := c.Get(ctx, types.NamespacedName{Name: realNodeName}, &node); err != nil {
			return false, client.IgnoreNotFound(err)
		}
		for _, g := range node.Status.GPUs {
			if g.Index == index {
				reason = string(g.Posture) + ": " + g.Reason
				return g.Posture == want, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("GPU %d of %s never %s: %v; last %q", index, realNodeName, want, err, reason)
	}
	t.Logf("GpuNode %s: posture %s (%s); GPU %d %s", realNodeName, node.Status.Posture, node.Status.Reason, index, reason)
	return reason
}

// publishedDevice returns the node's published device of that name.
func publishedDevice(t *testing.T, ctx context.Context, name string) resourceapi.Device {
	t.Helper()
	slices, err := cp.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range slices.Items {
		for _, d := range s.Spec.Devices {
			if s.Spec.Driver == framework.DriverName && s.Spec.Pool.Name == realNodeName && d.Name == name {
				return d
			}
		}
	}
	t.Fatalf("device %s not published", name)
	return resourceapi.Device{}
}

// servesV1DeviceTaintRules: the suite's API server serves the drain's API
// (resource.k8s.io/v1 DeviceTaintRule, GA in 1.37).
func servesV1DeviceTaintRules(t *testing.T) bool {
	t.Helper()
	list, err := cp.Client.Discovery().ServerResourcesForGroupVersion(resourceapi.SchemeGroupVersion.String())
	if err != nil {
		t.Fatalf("discovery of %s: %v", resourceapi.SchemeGroupVersion, err)
	}
	for _, r := range list.APIResources {
		if r.Name == "devicetaintrules" {
			return true
		}
	}
	return false
}

// controllerLogLines are the lines of the chart's controller containers'
// logs on the real node that contain s.
func controllerLogLines(t *testing.T, n *realNode, s string) []string {
	t.Helper()
	logs, err := filepath.Glob(filepath.Join(n.PodLogsDir, releaseNamespace+"_*controller*", "controller", "*.log"))
	if err != nil || len(logs) == 0 {
		t.Fatalf("no controller container logs under %s (%v)", n.PodLogsDir, err)
	}
	var lines []string
	for _, path := range logs {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(data), "\n") {
			if strings.Contains(line, s) {
				lines = append(lines, line)
			}
		}
	}
	return lines
}
