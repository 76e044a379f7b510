package kubeletsim

import (
	"context"
	"encoding/json"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2/ktesting"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	"k8s.io/utils/ptr"
)

const testNode = "node-1"

// These tests run the whole simulator against a fake clientset (no
// scheduler, no controllers: claims are created allocated and reserved) and
// a fake plugin; test/e2e runs it against a real control plane.

type simEnv struct {
	ctx    context.Context
	client *fake.Clientset
	sim    *Simulator
	plugin *fakePlugin
}

func startSim(t *testing.T, objects ...runtime.Object) *simEnv {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	client := fake.NewClientset(objects...)
	regDir := filepath.Join(t.TempDir(), "registry")
	sim, err := New(Config{Client: client, NodeName: testNode, RegistryDir: regDir, RetryBase: 20 * time.Millisecond, RetryMax: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error)
	go func() { done <- sim.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	waitFor(t, ctx, "simulator sync", func() bool { return isClosed(sim.Synced()) })
	plugin := startFakePlugin(t, testDriver, registerapi.DRAPlugin, filepath.Join(regDir, testDriver+"-reg.sock"), t.TempDir())
	return &simEnv{ctx: ctx, client: client, sim: sim, plugin: plugin}
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func claimPod(name, claimName string) *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID("uid-" + name)},
		Spec: v1.PodSpec{
			NodeName:       testNode,
			Containers:     []v1.Container{{Name: "ctr", Image: "registry.k8s.io/pause:3.10"}},
			ResourceClaims: []v1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To(claimName)}},
		},
	}
}

// reservedClaim is allocated on the node and reserved for pods.
func reservedClaim(name string, pods ...*v1.Pod) *resourceapi.ResourceClaim {
	claim := allocatedClaim(name, types.UID("uid-"+name), result(testDriver))
	for _, p := range pods {
		claim.Status.ReservedFor = append(claim.Status.ReservedFor,
			resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: p.Name, UID: p.UID})
	}
	return claim
}

func (e *simEnv) waitPod(t *testing.T, name string, cond func(*v1.Pod, error) bool) {
	t.Helper()
	waitFor(t, e.ctx, "pod "+name, func() bool {
		pod, err := e.client.CoreV1().Pods("ns").Get(e.ctx, name, metav1.GetOptions{})
		return cond(pod, err)
	})
}

func running(pod *v1.Pod, err error) bool { return err == nil && pod.Status.Phase == v1.PodRunning }
func gone(_ *v1.Pod, err error) bool      { return apierrors.IsNotFound(err) }

// deleteGracefully sets the deletion timestamp, as the apiserver does for a
// delete with a grace period; the simulator must finish the deletion.
func (e *simEnv) deleteGracefully(t *testing.T, name string) {
	t.Helper()
	pod, err := e.client.CoreV1().Pods("ns").Get(e.ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod.DeletionTimestamp = ptr.To(metav1.Now())
	pod.DeletionGracePeriodSeconds = ptr.To(int64(30))
	if _, err := e.client.CoreV1().Pods("ns").Update(e.ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func TestSimulatorPreparesRunsAndUnprepares(t *testing.T) {
	pod := claimPod("pod-a", "claim-a")
	env := startSim(t, pod, reservedClaim("claim-a", pod))

	env.waitPod(t, "pod-a", running)
	got, _ := env.client.CoreV1().Pods("ns").Get(env.ctx, "pod-a", metav1.GetOptions{})
	var cdi map[string][]string
	if err := json.Unmarshal([]byte(got.Annotations[CDIDevicesAnnotation]), &cdi); err != nil {
		t.Fatalf("CDI annotation %q: %v", got.Annotations[CDIDevicesAnnotation], err)
	}
	want := map[string][]string{"claim-a": {"k8s.gpu.gpuaas.io/claim=uid-claim-a-gpu-0"}}
	if !reflect.DeepEqual(cdi, want) {
		t.Errorf("CDI devices = %v, want %v", cdi, want)
	}
	if len(got.Status.ContainerStatuses) != 1 || !got.Status.ContainerStatuses[0].Ready {
		t.Errorf("container statuses = %+v, want one ready container", got.Status.ContainerStatuses)
	}
	prepared, _ := env.plugin.calls()
	wantClaim := &drapb.Claim{Namespace: "ns", Uid: "uid-claim-a", Name: "claim-a"}
	if len(prepared) != 1 || len(prepared[0]) != 1 || !reflect.DeepEqual(prepared[0][0], wantClaim) {
		t.Errorf("NodePrepareResources calls = %v, want one with %v", prepared, wantClaim)
	}

	env.deleteGracefully(t, "pod-a")
	env.waitPod(t, "pod-a", gone)
	_, unprepared := env.plugin.calls()
	if len(unprepared) != 1 || !reflect.DeepEqual(unprepared[0][0], wantClaim) {
		t.Errorf("NodeUnprepareResources calls = %v, want one with %v", unprepared, wantClaim)
	}
}

func TestSimulatorSharedClaimUnpreparedAfterLastPod(t *testing.T) {
	a, b := claimPod("pod-a", "shared"), claimPod("pod-b", "shared")
	env := startSim(t, a, b, reservedClaim("shared", a, b))
	env.waitPod(t, "pod-a", running)
	env.waitPod(t, "pod-b", running)

	env.deleteGracefully(t, "pod-a")
	env.waitPod(t, "pod-a", gone)
	if _, unprepared := env.plugin.calls(); len(unprepared) != 0 {
		t.Fatalf("claim unprepared while pod-b still uses it: %v", unprepared)
	}
	// A force delete: the pod just disappears from the API.
	if err := env.client.CoreV1().Pods("ns").Delete(env.ctx, "pod-b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, env.ctx, "unprepare", func() bool { _, u := env.plugin.calls(); return len(u) == 1 })
}

func TestSimulatorReportsFailedPrepare(t *testing.T) {
	pod := claimPod("pod-a", "claim-a")
	env := startSim(t, pod, reservedClaim("claim-a", pod))
	env.plugin.setPrepareError(`decoding GpuConfig: unknown field "bogus"`)

	waitFor(t, env.ctx, "FailedPrepareDynamicResources event", func() bool {
		events, _ := env.client.CoreV1().Events("ns").List(env.ctx, metav1.ListOptions{})
		for _, e := range events.Items {
			if e.Reason == ReasonFailedPrepare && e.Type == v1.EventTypeWarning && strings.Contains(e.Message, `unknown field "bogus"`) {
				return true
			}
		}
		return false
	})
	env.plugin.setPrepareError("")
	env.waitPod(t, "pod-a", running) // the retry succeeds
}

func TestSimulatorWaitsForReservation(t *testing.T) {
	pod := claimPod("pod-a", "claim-a")
	env := startSim(t, pod, reservedClaim("claim-a")) // allocated, not reserved for the pod
	time.Sleep(300 * time.Millisecond)
	if prepared, _ := env.plugin.calls(); len(prepared) != 0 {
		t.Fatalf("prepared a claim not reserved for the pod: %v", prepared)
	}
	claim, _ := env.client.ResourceV1().ResourceClaims("ns").Get(env.ctx, "claim-a", metav1.GetOptions{})
	claim.Status.ReservedFor = reservedClaim("claim-a", pod).Status.ReservedFor
	if _, err := env.client.ResourceV1().ResourceClaims("ns").UpdateStatus(env.ctx, claim, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	env.waitPod(t, "pod-a", running)
}

func TestSimulatorRunsPodsWithoutClaims(t *testing.T) {
	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "plain", Namespace: "ns", UID: "uid-plain"},
		Spec:       v1.PodSpec{NodeName: testNode, Containers: []v1.Container{{Name: "ctr", Image: "pause"}}},
	}
	env := startSim(t, pod)
	env.waitPod(t, "plain", running)
	node, err := env.client.CoreV1().Nodes().Get(env.ctx, testNode, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if node.Labels[v1.LabelHostname] != testNode || node.Status.Conditions[0].Status != v1.ConditionTrue {
		t.Errorf("node = %+v, want hostname label and Ready=True", node)
	}
}
