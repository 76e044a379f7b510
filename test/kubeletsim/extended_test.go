package kubeletsim

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	"k8s.io/utils/ptr"
)

// These tests play the scheduler's part of KEP-5004 by hand: a pod limited
// on nvidia.com/gpu, the claim the scheduler creates for it and the
// pod.status.extendedResourceClaimStatus that names the claim.

const gpuResource v1.ResourceName = "nvidia.com/gpu"

// extendedPod has one container per name, each limited to one GPU; without
// a status, as the scheduler leaves it before it allocates.
func extendedPod(name string, containers ...string) *v1.Pod {
	one := v1.ResourceList{gpuResource: resource.MustParse("1")}
	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID("uid-" + name)},
		Spec:       v1.PodSpec{NodeName: testNode},
	}
	for _, c := range containers {
		pod.Spec.Containers = append(pod.Spec.Containers, v1.Container{
			Name: c, Image: "registry.k8s.io/pause:3.10",
			Resources: v1.ResourceRequirements{Limits: one, Requests: one},
		})
	}
	return pod
}

// extendedStatus is the status the scheduler sets: container i gets request
// container-i-request-0 of the claim, as the scheduler names them.
func extendedStatus(pod *v1.Pod, claimName string) *v1.PodExtendedResourceClaimStatus {
	st := &v1.PodExtendedResourceClaimStatus{ResourceClaimName: claimName}
	for i, c := range pod.Spec.Containers {
		st.RequestMappings = append(st.RequestMappings, v1.ContainerExtendedResourceRequest{
			ContainerName: c.Name, ResourceName: string(gpuResource), RequestName: fmt.Sprintf("container-%d-request-0", i),
		})
	}
	return st
}

// extendedClaim is the claim the scheduler creates for a pod with status
// st: controlled by the pod, one device per mapped request, reserved for
// the pod.
func extendedClaim(pod *v1.Pod, st *v1.PodExtendedResourceClaimStatus) *resourceapi.ResourceClaim {
	var results []resourceapi.DeviceRequestAllocationResult
	for i, m := range st.RequestMappings {
		r := result(testDriver)
		r.Request, r.Device = m.RequestName, fmt.Sprintf("gpu-%d", i)
		results = append(results, r)
	}
	claim := allocatedClaim(st.ResourceClaimName, types.UID("uid-"+st.ResourceClaimName), results...)
	claim.Annotations = map[string]string{resourceapi.ExtendedResourceClaimAnnotation: "true"}
	claim.OwnerReferences = []metav1.OwnerReference{{
		APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID,
		Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true),
	}}
	claim.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: pod.Name, UID: pod.UID}}
	return claim
}

// create stores the claim, then the pod, so the first sync finds both.
func (e *simEnv) create(t *testing.T, claim *resourceapi.ResourceClaim, pod *v1.Pod) {
	t.Helper()
	if _, err := e.client.ResourceV1().ResourceClaims("ns").Create(e.ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.client.CoreV1().Pods("ns").Create(e.ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func annotation(t *testing.T, pod *v1.Pod, key string) map[string][]string {
	t.Helper()
	var out map[string][]string
	if err := json.Unmarshal([]byte(pod.Annotations[key]), &out); err != nil {
		t.Fatalf("annotation %s=%q: %v", key, pod.Annotations[key], err)
	}
	return out
}

func TestSimulatorPreparesExtendedResourceClaim(t *testing.T) {
	env := startSim(t)
	pod := extendedPod("pod-a", "ctr-0", "ctr-1")
	pod.Status.ExtendedResourceClaimStatus = extendedStatus(pod, "pod-a-extended-resources-x7k2p")
	claim := extendedClaim(pod, pod.Status.ExtendedResourceClaimStatus)
	env.plugin.setRequests(string(claim.UID), "container-0-request-0", "container-1-request-0")
	env.create(t, claim, pod)

	env.waitPod(t, "pod-a", running)
	wantClaim := &drapb.Claim{Namespace: "ns", Uid: string(claim.UID), Name: claim.Name}
	if prepared, _ := env.plugin.calls(); len(prepared) != 1 || len(prepared[0]) != 1 || !reflect.DeepEqual(prepared[0][0], wantClaim) {
		t.Errorf("NodePrepareResources calls = %v, want one with %v", prepared, wantClaim)
	}
	got, _ := env.client.CoreV1().Pods("ns").Get(env.ctx, "pod-a", metav1.GetOptions{})
	dev0, dev1 := "k8s.gpu.gpuaas.io/claim=uid-pod-a-extended-resources-x7k2p-gpu-0", "k8s.gpu.gpuaas.io/claim=uid-pod-a-extended-resources-x7k2p-gpu-1"
	if cdi, want := annotation(t, got, CDIDevicesAnnotation), map[string][]string{claim.Name: {dev0, dev1}}; !reflect.DeepEqual(cdi, want) {
		t.Errorf("CDI devices per claim = %v, want %v", cdi, want)
	}
	if cdi, want := annotation(t, got, CDIContainerDevicesAnnotation), map[string][]string{"ctr-0": {dev0}, "ctr-1": {dev1}}; !reflect.DeepEqual(cdi, want) {
		t.Errorf("CDI devices per container = %v, want %v", cdi, want)
	}

	env.deleteGracefully(t, "pod-a")
	env.waitPod(t, "pod-a", gone)
	if _, unprepared := env.plugin.calls(); len(unprepared) != 1 || len(unprepared[0]) != 1 || !reflect.DeepEqual(unprepared[0][0], wantClaim) {
		t.Errorf("NodeUnprepareResources calls = %v, want one with %v", unprepared, wantClaim)
	}
}

func TestSimulatorRefusesExtendedClaimNotOwnedByPod(t *testing.T) {
	pod := extendedPod("pod-a", "ctr")
	pod.Status.ExtendedResourceClaimStatus = extendedStatus(pod, "someone-elses")
	claim := extendedClaim(pod, pod.Status.ExtendedResourceClaimStatus)
	claim.OwnerReferences[0].Name, claim.OwnerReferences[0].UID = "pod-b", "uid-pod-b"
	env := startSim(t, pod, claim)

	waitFor(t, env.ctx, "FailedPrepareDynamicResources event", func() bool {
		events, _ := env.client.CoreV1().Events("ns").List(env.ctx, metav1.ListOptions{})
		for _, e := range events.Items {
			if e.Reason == ReasonFailedPrepare && e.Type == v1.EventTypeWarning && strings.Contains(e.Message, "Pod is not owner") {
				return true
			}
		}
		return false
	})
	got, _ := env.client.CoreV1().Pods("ns").Get(env.ctx, "pod-a", metav1.GetOptions{})
	if got.Status.Phase == v1.PodRunning {
		t.Error("pod started with a claim it does not own")
	}
	if prepared, _ := env.plugin.calls(); len(prepared) != 0 {
		t.Errorf("prepared a claim the pod does not own: %v", prepared)
	}
}

func TestSimulatorWaitsForExtendedResourceClaimStatus(t *testing.T) {
	pod := extendedPod("pod-a", "ctr")
	env := startSim(t, pod)
	time.Sleep(300 * time.Millisecond)
	got, _ := env.client.CoreV1().Pods("ns").Get(env.ctx, "pod-a", metav1.GetOptions{})
	if got.Status.Phase == v1.PodRunning {
		t.Fatal("pod started before the scheduler allocated its extended resource")
	}

	// What the scheduler does in PreBind: create the claim, set the status.
	st := extendedStatus(pod, "pod-a-extended-resources-x7k2p")
	claim := extendedClaim(pod, st)
	env.plugin.setRequests(string(claim.UID), "container-0-request-0")
	if _, err := env.client.ResourceV1().ResourceClaims("ns").Create(env.ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	got.Status.ExtendedResourceClaimStatus = st
	if _, err := env.client.CoreV1().Pods("ns").UpdateStatus(env.ctx, got, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	env.waitPod(t, "pod-a", running)
	got, _ = env.client.CoreV1().Pods("ns").Get(env.ctx, "pod-a", metav1.GetOptions{})
	want := map[string][]string{"ctr": {"k8s.gpu.gpuaas.io/claim=uid-pod-a-extended-resources-x7k2p-gpu-0"}}
	if cdi := annotation(t, got, CDIContainerDevicesAnnotation); !reflect.DeepEqual(cdi, want) {
		t.Errorf("CDI devices per container = %v, want %v", cdi, want)
	}
}
