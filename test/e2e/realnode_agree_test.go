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
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

// testSimulatorAgrees runs the same pods on a simulated node and on the
// real one and compares, per claim, the CDI devices each kubelet got from
// the plugin for each request: the simulator's record against the real
// kubelet's checkpoint. Device names and claim UIDs differ between the
// nodes, so each CDI ID is compared as "<request>: claim=<claim>-<device>"
// with the claim and device replaced by their roles. The pods: one asking
// for two GPUs through the extended resource, one whose two containers each
// use one request of a claim.
func testSimulatorAgrees(t *testing.T, n *realNode) {
	ctx := framework.Context(t, 4*time.Minute)
	sim := startNode(t)
	extendedResourceClass(t, ctx)
	ns := cp.CreateNamespace(t, "agree")
	tmpl := &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: "two-requests", Namespace: ns},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{
				{Name: "first", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu.gpuaas.io"}},
				{Name: "second", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu.gpuaas.io", Count: 2, AllocationMode: resourceapi.DeviceAllocationModeExactCount}},
			},
		}}},
	}
	if _, err := cp.Client.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Without DRAExtendedResource (1.34 and 1.35 by default) no pod gets a
	// GPU as an extended resource on either kubelet: ExtendedResource checks
	// that it waits, so here only the claim's split is compared.
	kinds := []string{"split"}
	if suiteShape(t).extendedResource {
		kinds = append(kinds, "extended")
	}
	for _, node := range []string{sim.Name, n.Name} {
		if suiteShape(t).extendedResource {
			ext := pinnedPod(ns, "extended-"+node, node)
			ext.Spec.Containers[0].Resources.Limits = v1.ResourceList{extendedResource: resource.MustParse("2")}
			createAndRun(t, ctx, ext)
		}
		split := pinnedPod(ns, "split-"+node, node)
		split.Spec.ResourceClaims = []v1.PodResourceClaim{{Name: "gpus", ResourceClaimTemplateName: ptr.To("two-requests")}}
		split.Spec.Containers[0].Resources.Claims = []v1.ResourceClaim{{Name: "gpus", Request: "first"}}
		second := split.Spec.Containers[0]
		second.Name, second.Resources.Claims = "ctr2", []v1.ResourceClaim{{Name: "gpus", Request: "second"}}
		split.Spec.Containers = append(split.Spec.Containers, second)
		createAndRun(t, ctx, split)
	}
	for _, kind := range kinds {
		simPod := runningPod(t, ctx, ns, kind+"-"+sim.Name)
		realPod := runningPod(t, ctx, ns, kind+"-"+n.Name)
		got := simCDIByRequest(t, ctx, simPod)
		want := realCDIByRequest(t, ctx, n, realPod)
		if !slices.Equal(got, want) {
			t.Errorf("%s pod: the simulator prepared %v, the real kubelet %v", kind, got, want)
		} else {
			t.Logf("%s pod: both kubelets got %v", kind, got)
		}
	}
}

// pinnedPod is a workload pod that can only run on node.
func pinnedPod(namespace, name, node string) *v1.Pod {
	pod := workloadPod(namespace, name)
	pod.Spec.Affinity = &v1.Affinity{NodeAffinity: &v1.NodeAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{{
			MatchFields: []v1.NodeSelectorRequirement{{Key: "metadata.name", Operator: v1.NodeSelectorOpIn, Values: []string{node}}},
		}}},
	}}
	return pod
}

// extendedResourceClass applies the demo's DeviceClass that maps the
// extended resource to our whole GPUs.
func extendedResourceClass(t *testing.T, ctx context.Context) {
	t.Helper()
	objs, err := framework.ReadObjects(filepath.Join(repoRoot, "demo", "extended-resource", "extended-resource.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if o.GetKind() != "DeviceClass" {
			continue
		}
		class, _, _ := unstructured.NestedString(o.Object, "spec", "extendedResourceName")
		if class != extendedResource {
			t.Fatalf("the demo's DeviceClass %s maps %q, want %s", o.GetName(), class, extendedResource)
		}
		if _, err := cp.ApplyObject(ctx, o, ""); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Fatal("the extended-resource demo spec has no DeviceClass")
}

// roles names each allocated device of a pod's claims by its request and
// ordinal ("second#1"), and each claim by "claim<i>", so CDI IDs of two
// nodes can be compared.
type roles struct {
	claims  map[string]string // claim UID -> role
	devices map[string]string // claim UID + "/" + device -> role
}

func podRoles(t *testing.T, ctx context.Context, pod *v1.Pod) (roles, []*resourceapi.ResourceClaim) {
	t.Helper()
	r := roles{claims: map[string]string{}, devices: map[string]string{}}
	claims := allClaims(t, ctx, pod)
	for i, c := range claims {
		r.claims[string(c.UID)] = fmt.Sprintf("claim%d", i)
		seen := map[string]int{}
		for _, res := range c.Status.Allocation.Devices.Results {
			r.devices[string(c.UID)+"/"+res.Device] = fmt.Sprintf("%s#%d", res.Request, seen[res.Request])
			seen[res.Request]++
		}
	}
	return r, claims
}

// normalize rewrites a CDI ID "k8s.gpu.gpuaas.io/claim=<uid>-<device>" of
// claim uid to its roles.
func (r roles) normalize(uid, id string) string {
	prefix := "k8s." + framework.DriverName + "/claim=" + uid + "-"
	device, ok := strings.CutPrefix(id, prefix)
	if !ok {
		return "unexpected " + id
	}
	return r.claims[uid] + "-" + r.devices[uid+"/"+device]
}

// simCDIByRequest is what the simulator recorded, normalized and sorted.
func simCDIByRequest(t *testing.T, ctx context.Context, pod *v1.Pod) []string {
	t.Helper()
	r, claims := podRoles(t, ctx, pod)
	byName := cdiDevices(t, pod)
	var out []string
	for _, c := range claims {
		for _, id := range byName[c.Name] {
			out = append(out, r.normalize(string(c.UID), id))
		}
	}
	slices.Sort(out)
	return out
}

// realCDIByRequest is what the real kubelet checkpointed, normalized and
// sorted; it waits for the checkpoint to hold the pod's claims.
func realCDIByRequest(t *testing.T, ctx context.Context, n *realNode, pod *v1.Pod) []string {
	t.Helper()
	r, claims := podRoles(t, ctx, pod)
	var out []string
	err := wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(context.Context) (bool, error) {
		prepared, err := n.PreparedClaims()
		if err != nil {
			return false, err
		}
		out = out[:0]
		for _, c := range claims {
			devices, ok := prepared[string(c.UID)]
			if !ok {
				return false, nil
			}
			for _, d := range devices {
				for _, id := range d.CDIDeviceIDs {
					out = append(out, r.normalize(string(c.UID), id))
				}
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("the real kubelet's checkpoint: %v", err)
	}
	slices.Sort(out)
	return out
}
