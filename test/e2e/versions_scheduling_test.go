package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/dynamic-resource-allocation/resourceclaim"

	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

// userCase is one thing a user asks of the driver on a cluster: a pod with
// one claim. On a version or gate setting that lacks what it needs it must
// wait with the scheduler's own reason, never get something else.
type userCase struct {
	name string
	tmpl func(ns string) *resourceapi.ResourceClaimTemplate
	// needs: the storedShape feature it depends on; "" for none.
	needs string
	// device tells, from the allocated device, whether the pod got what
	// it asked for (the fallback of firstAvailable included).
	device func(name string, shape storedShape) bool
	// release: the pod is deleted once checked, and its claim waited
	// away, so that what it held is free for the checks after it.
	release bool
}

const (
	onIndex   = `device.attributes["gpu.gpuaas.io"].index == %d`
	mig1g10gb = ` && device.attributes["gpu.gpuaas.io"].profile == "1g.10gb"`
)

func selectedTemplate(name, ns, class, cel string) *resourceapi.ResourceClaimTemplate {
	tmpl := templateFor(name, ns, class)
	tmpl.Spec.Spec.Devices.Requests[0].Exactly.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: cel}}}
	return tmpl
}

// userCases: a whole GPU, two GPUs in one request, a time-slice replica, a memory share, a dynamic
// MIG device, and firstAvailable preferring a MIG device over a whole GPU.
var userCases = []userCase{
	{name: "whole", tmpl: func(ns string) *resourceapi.ResourceClaimTemplate {
		return selectedTemplate("whole", ns, deviceClass, fmt.Sprintf(onIndex, 0))
	}, device: func(d string, _ storedShape) bool { return d == "gpu-0" }},
	{name: "two-gpus", tmpl: func(ns string) *resourceapi.ResourceClaimTemplate {
		tmpl := selectedTemplate("two-gpus", ns, deviceClass, `device.attributes["gpu.gpuaas.io"].index in [2, 3]`)
		tmpl.Spec.Spec.Devices.Requests[0].Exactly.Count = 2
		return tmpl
	}, device: func(d string, _ storedShape) bool { return d == "gpu-2" || d == "gpu-3" }},
	{name: "replica", tmpl: func(ns string) *resourceapi.ResourceClaimTemplate {
		return templateFor("replica", ns, "timeslice.gpuaas.io")
	}, device: func(d string, _ storedShape) bool { return strings.HasPrefix(d, "gpu-4-ts-") }},
	{name: "share", needs: "shares", tmpl: func(ns string) *resourceapi.ResourceClaimTemplate {
		tmpl := templateFor("share", ns, "shared.gpuaas.io")
		tmpl.Spec.Spec.Devices.Requests[0].Exactly.Capacity = &resourceapi.CapacityRequirements{
			Requests: map[resourceapi.QualifiedName]resource.Quantity{"memory": resource.MustParse("10Gi")},
		}
		return tmpl
	}, device: func(d string, _ storedShape) bool { return d == "gpu-5-shared" }},
	{name: "mig", needs: "dynamicMIG", tmpl: func(ns string) *resourceapi.ResourceClaimTemplate {
		return selectedTemplate("mig", ns, "mig.gpuaas.io", fmt.Sprintf(onIndex, 6)+mig1g10gb)
	}, device: func(d string, _ storedShape) bool { return strings.HasPrefix(d, "gpu-6-mig-1g10gb-") }},
	{name: "first-available", tmpl: func(ns string) *resourceapi.ResourceClaimTemplate {
		tmpl := templateFor("first-available", ns, "")
		tmpl.Spec.Spec.Devices.Requests[0] = resourceapi.DeviceRequest{Name: "gpu", FirstAvailable: []resourceapi.DeviceSubRequest{
			{Name: "mig", DeviceClassName: "mig.gpuaas.io", AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1,
				Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: fmt.Sprintf(onIndex, 6) + mig1g10gb}}}},
			{Name: "whole", DeviceClassName: deviceClass, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1,
				Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: fmt.Sprintf(onIndex, 1)}}}},
		}}
		return tmpl
	}, device: func(d string, shape storedShape) bool {
		if shape.dynamicMIG {
			return strings.HasPrefix(d, "gpu-6-mig-1g10gb-")
		}
		return d == "gpu-1"
	}},
	{name: "four-migs", needs: "dynamicMIG", tmpl: fourMIGs, release: true,
		device: func(d string, _ storedShape) bool { return strings.HasPrefix(d, "gpu-7-mig-") }},
}

// fourMIGs is demo/specs/mig/four-profiles-one-gpu's claim: 1g.10gb,
// 1g.10gb+me, 2g.20gb and 3g.40gb, all seven compute slices of one GPU
// (matchAttribute parentUUID). The mig case holds a 1g of GPU 6, so only
// GPU 7 can take them, and the allocator must find it after GPU 6 failed.
func fourMIGs(ns string) *resourceapi.ResourceClaimTemplate {
	tmpl := templateFor("four-migs", ns, "")
	var names []string
	tmpl.Spec.Spec.Devices.Requests = nil
	for _, profile := range []string{"1g.10gb", "1g.10gb+me", "2g.20gb", "3g.40gb"} {
		name := "mig-" + strings.NewReplacer(".", "", "+", "-").Replace(profile)
		names = append(names, name)
		cel := fmt.Sprintf(`device.attributes["gpu.gpuaas.io"].profile == %q`, profile)
		tmpl.Spec.Spec.Devices.Requests = append(tmpl.Spec.Spec.Devices.Requests, resourceapi.DeviceRequest{Name: name,
			Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "mig.gpuaas.io",
				Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: cel}}}}})
	}
	parent := resourceapi.FullyQualifiedName("gpu.gpuaas.io/parentUUID")
	tmpl.Spec.Spec.Devices.Constraints = []resourceapi.DeviceConstraint{{Requests: names, MatchAttribute: &parent}}
	return tmpl
}

// Issue 35: what a user does, with each version's own scheduler and
// controller-manager (they allocate; the API server only stores), for
// each gate setting of apiServerCases: every case runs or waits as the
// stored pool says, and pending dynamic-MIG pods queued behind a whole GPU
// stay pending through a plugin restart: no GPU is handed out whole and in
// part. make e2e runs the oldest version (E2E_K8S_VERSIONS=v1.34.4); make
// test-versions every one.
func TestUserCasesOnEachControlPlane(t *testing.T) {
	matrix := newVersionMatrix()
	for _, c := range apiServerCases {
		t.Run(c.name, func(t *testing.T) {
			start := time.Now()
			cells := testUserCasesOn(t, c)
			matrix.add(t, c, cells, time.Since(start))
		})
	}
	// Not in the matrix yet (nextVersionCases).
	for _, c := range nextVersionCases {
		t.Run(c.name, func(t *testing.T) {
			skipUnlessNamed(t, c)
			testUserCasesOn(t, c)
		})
	}
	matrix.write(t)
}

func testUserCasesOn(t *testing.T, c apiServerCase) map[string]outcome {
	opts := versionOptions(t, c, "kube-apiserver", "kube-scheduler", "kube-controller-manager")
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	api := startVersionControlPlane(ctx, t, c.version, opts)
	for _, spec := range []string{"00-catalog", filepath.Join("sharing", "00-classes")} {
		if _, err := api.Apply(ctx, filepath.Join(repoRoot, "demo", "specs", spec), ""); err != nil {
			t.Fatalf("applying %s: %v", spec, err)
		}
	}
	node, err := api.StartNode(ctx, framework.NodeOptions{Name: "versions-node", PluginBinary: pluginBinary,
		NodeConfig: filepath.Join(repoRoot, "demo", "node-config.yaml")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("plugin log %s, last lines:\n%s", node.Plugin.LogPath, node.Plugin.Tail(30))
		}
		_ = node.Stop(context.Background())
	})
	ns := api.CreateNamespace(t, "versions")
	cells := map[string]outcome{}
	record := func(name string, o outcome) { cells[name] = o }
	for _, u := range userCases {
		checkUserCase(ctx, t, api, node, ns, u, c.want, record)
	}
	if checkQueuedBehindWholeGPU(ctx, t, api, node, ns, c.want.dynamicMIG) {
		record(queuedCase, outcomeStaysPending)
	}
	return cells
}

// checkUserCase creates the case's pod and waits for the outcome the
// stored pool promises: running with the device it asked for, or
// unschedulable.
func checkUserCase(ctx context.Context, t *testing.T, api *framework.ControlPlane, node *framework.Node, ns string, u userCase, shape storedShape, record func(string, outcome)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	createTemplatePodOn(t, ctx, api, u.tmpl(ns))
	want := u.expected(shape)
	waits := want == outcomeWaits
	if want == outcomeWaitsAllocator {
		// Which GPU the allocator tries first decides: either is right
		// (storedShape.keepsRejectedCounters), and the cell says "may wait".
		waits = !waitsOrRunsOn(t, ctx, api, ns, u.name)
	}
	if waits {
		msg, err := api.WaitForPodUnschedulable(ctx, ns, u.name)
		if err != nil {
			t.Errorf("%s: the pod should wait (%s): %v", u.name, want, err)
			return
		}
		t.Logf("%s waits: %s", u.name, msg)
		record(u.name, want)
		if err := api.Client.CoreV1().Pods(ns).Delete(ctx, u.name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		return
	}
	pod, err := api.WaitForPodRunning(ctx, ns, u.name)
	if err != nil {
		t.Errorf("%s: %v", u.name, err)
		return
	}
	claim := claimOfPod(ctx, t, api, pod)
	if claim == nil || claim.Status.Allocation == nil || len(claim.Status.Allocation.Devices.Results) == 0 {
		t.Errorf("%s: claim %+v not allocated", u.name, claim)
		return
	}
	got := want
	for _, r := range claim.Status.Allocation.Devices.Results {
		if !u.device(r.Device, shape) {
			t.Errorf("%s got device %s", u.name, r.Device)
			got = "got " + outcome(r.Device)
		}
	}
	checkPrepared(t, node, pod, claim)
	record(u.name, got)
	if u.release {
		if err := api.Client.CoreV1().Pods(ns).Delete(ctx, u.name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := api.WaitForClaimGone(ctx, ns, claim.Name); err != nil {
			t.Errorf("%s: %v", u.name, err)
		}
	}
}

// checkQueuedBehindWholeGPU holds GPU 7 whole (where dynamic MIG is
// offered: without counters a dynamic-MIG GPU is not offered at all, and
// the whole-GPU pod waits too) and queues a MIG device of it, restarts the
// plugin (the moment the stored pool used to offer dynamic-MIG devices
// without counters on 1.34 and 1.35 with default gates), and checks that
// the MIG pod is still pending once the pool has settled again, and that
// no claim holds a GPU whole and in part. It says whether all that held.
func checkQueuedBehindWholeGPU(ctx context.Context, t *testing.T, api *framework.ControlPlane, node *framework.Node, ns string, dynamicMIG bool) bool {
	t.Helper()
	createTemplatePodOn(t, ctx, api, selectedTemplate("whole-7", ns, deviceClass, fmt.Sprintf(onIndex, 7)))
	if dynamicMIG {
		if _, err := api.WaitForPodRunning(ctx, ns, "whole-7"); err != nil {
			t.Fatal(err)
		}
	} else if _, err := api.WaitForPodUnschedulable(ctx, ns, "whole-7"); err != nil {
		t.Fatalf("GPU 7 (dynamic MIG) offered whole without counters: %v", err)
	}
	createTemplatePodOn(t, ctx, api, selectedTemplate("mig-7", ns, "mig.gpuaas.io", fmt.Sprintf(onIndex, 7)+mig1g10gb))
	if _, err := api.WaitForPodUnschedulable(ctx, ns, "mig-7"); err != nil {
		t.Fatalf("a MIG device of GPU 7 allocated beside the whole GPU: %v", err)
	}
	if err := node.RestartPlugin(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := node.WaitForDevices(ctx, 1); err != nil {
		t.Fatal(err)
	}
	// The scheduler retries an unschedulable pod on every slice change and
	// at least every few seconds; give it the restart's changes and more.
	time.Sleep(15 * time.Second)
	pod, err := api.Client.CoreV1().Pods(ns).Get(ctx, "mig-7", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	held := true
	if pod.Spec.NodeName != "" {
		t.Errorf("after the plugin's restart the MIG pod of GPU 7 (held whole: %v) was scheduled to %s", dynamicMIG, pod.Spec.NodeName)
		held = false
	}
	if both := wholeAndPart(ctx, t, api); len(both) > 0 {
		t.Errorf("GPUs handed out whole and in part: %v", both)
		held = false
	}
	return held
}

// wholeAndPart names every GPU of which some claim holds the whole device
// and another a MIG device.
func wholeAndPart(ctx context.Context, t *testing.T, api *framework.ControlPlane) []string {
	t.Helper()
	claims, err := api.Client.ResourceV1().ResourceClaims("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var devices []string
	for _, c := range claims.Items {
		if c.Status.Allocation != nil {
			for _, r := range c.Status.Allocation.Devices.Results {
				devices = append(devices, r.Device)
			}
		}
	}
	var both []string
	for _, d := range devices {
		if strings.Count(d, "-") != 1 {
			continue // only whole GPUs: gpu-N
		}
		if slices.ContainsFunc(devices, func(o string) bool { return strings.HasPrefix(o, d+"-mig-") }) {
			both = append(both, d)
		}
	}
	return both
}

// claimOfPod is the pod's one claim, read from api.
func claimOfPod(ctx context.Context, t *testing.T, api *framework.ControlPlane, pod *v1.Pod) *resourceapi.ResourceClaim {
	t.Helper()
	name, _, err := resourceclaim.Name(pod, &pod.Spec.ResourceClaims[0])
	if err != nil || name == nil {
		t.Fatalf("pod %s: claim name %v: %v", pod.Name, name, err)
	}
	claim, err := api.Client.ResourceV1().ResourceClaims(pod.Namespace).Get(ctx, *name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return claim
}
