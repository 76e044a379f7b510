package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/dynamic-resource-allocation/resourceclaim"

	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
	"github.com/gpuaas/gpu-dra-driver/test/kubeletsim"
)

const deviceClass = "gpu.gpuaas.io"

// createGPUPod creates a ResourceClaimTemplate asking for count GPUs (with
// optional opaque parameters) and a pod using it, both named name.
func createGPUPod(t *testing.T, ctx context.Context, namespace, name string, count int64, params map[string]any) {
	t.Helper()
	tmpl := &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{
				DeviceClassName: deviceClass, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: count,
			}}},
			Config: opaqueConfig(t, params),
		}}},
	}
	createTemplatePod(t, ctx, tmpl)
}

func opaqueConfig(t *testing.T, params map[string]any) []resourceapi.DeviceClaimConfiguration {
	if params == nil {
		return nil
	}
	raw, err := json.Marshal(params)
	if err != nil {
		t.Fatal(err)
	}
	return []resourceapi.DeviceClaimConfiguration{{DeviceConfiguration: resourceapi.DeviceConfiguration{
		Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: framework.DriverName, Parameters: runtime.RawExtension{Raw: raw}},
	}}}
}

func runningPod(t *testing.T, ctx context.Context, namespace, name string) *v1.Pod {
	t.Helper()
	pod, err := cp.WaitForPodRunning(ctx, namespace, name)
	if err != nil {
		t.Fatal(err)
	}
	return pod
}

// podClaims returns the ResourceClaims a pod uses, resolving generated names
// through the pod status as the kubelet does.
func podClaims(t *testing.T, ctx context.Context, pod *v1.Pod) []*resourceapi.ResourceClaim {
	t.Helper()
	var claims []*resourceapi.ResourceClaim
	for i := range pod.Spec.ResourceClaims {
		name, _, err := resourceclaim.Name(pod, &pod.Spec.ResourceClaims[i])
		if err != nil {
			t.Fatalf("pod %s: %v", pod.Name, err)
		}
		if name == nil {
			continue
		}
		claim, err := cp.Client.ResourceV1().ResourceClaims(pod.Namespace).Get(ctx, *name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("getting claim of pod %s: %v", pod.Name, err)
		}
		claims = append(claims, claim)
	}
	return claims
}

// onlyClaim returns the single claim of a pod.
func onlyClaim(t *testing.T, ctx context.Context, pod *v1.Pod) *resourceapi.ResourceClaim {
	t.Helper()
	claims := podClaims(t, ctx, pod)
	if len(claims) != 1 {
		t.Fatalf("pod %s has %d claims, want 1", pod.Name, len(claims))
	}
	return claims[0]
}

// checkPrepared asserts a claim is allocated to our devices on the node and
// prepared: CDI spec and checkpoint present, and the pod got one CDI device
// per allocated device, named after the claim UID and the device.
func checkPrepared(t *testing.T, node *framework.Node, pod *v1.Pod, claim *resourceapi.ResourceClaim) {
	t.Helper()
	if claim.Status.Allocation == nil {
		t.Fatalf("claim %s not allocated", claim.Name)
	}
	var want []string
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != framework.DriverName || r.Pool != node.Name {
			t.Errorf("claim %s: device %s/%s of driver %s, want driver %s on pool %s", claim.Name, r.Pool, r.Device, r.Driver, framework.DriverName, node.Name)
		}
		want = append(want, fmt.Sprintf("k8s.%s/claim=%s-%s", framework.DriverName, claim.UID, r.Device))
	}
	slices.Sort(want)
	if got := cdiDevices(t, pod)[claim.Name]; !slices.Equal(got, want) {
		t.Errorf("pod %s, claim %s: CDI devices %v, want %v", pod.Name, claim.Name, got, want)
	}
	for _, path := range []string{node.CDISpecPath(claim.UID), node.CheckpointPath(claim.UID)} {
		if _, err := os.Stat(path); err != nil {
			t.Errorf("claim %s: %v", claim.Name, err)
		}
	}
}

// checkUnprepared asserts the plugin removed the claim's files.
func checkUnprepared(t *testing.T, node *framework.Node, claim *resourceapi.ResourceClaim) {
	t.Helper()
	for _, path := range []string{node.CDISpecPath(claim.UID), node.CheckpointPath(claim.UID)} {
		if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("claim %s: %s still there after unprepare (stat: %v)", claim.Name, path, err)
		}
	}
}

// cdiDevices reads what the node simulator recorded on the pod.
func cdiDevices(t *testing.T, pod *v1.Pod) map[string][]string {
	t.Helper()
	value, ok := pod.Annotations[kubeletsim.CDIDevicesAnnotation]
	if !ok {
		return nil
	}
	var devices map[string][]string
	if err := json.Unmarshal([]byte(value), &devices); err != nil {
		t.Fatalf("pod %s: annotation %s=%q: %v", pod.Name, kubeletsim.CDIDevicesAnnotation, value, err)
	}
	return devices
}

// createTemplatePod creates a claim template and a pod of the same name
// whose one container uses the claim made from it.
func createTemplatePod(t testing.TB, ctx context.Context, tmpl *resourceapi.ResourceClaimTemplate) {
	t.Helper()
	createTemplatePodOn(t, ctx, cp, tmpl)
}

// createTemplatePodOn is createTemplatePod on another control plane.
func createTemplatePodOn(t testing.TB, ctx context.Context, c *framework.ControlPlane, tmpl *resourceapi.ResourceClaimTemplate) {
	t.Helper()
	if _, err := c.Client.ResourceV1().ResourceClaimTemplates(tmpl.Namespace).Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating ResourceClaimTemplate: %v", err)
	}
	createPodOn(t, ctx, c, tmpl.Namespace, tmpl.Name, tmpl.Name)
}

// createPod creates a pod with one container using a claim from template.
func createPod(t testing.TB, ctx context.Context, namespace, name, template string) {
	t.Helper()
	createPodOn(t, ctx, cp, namespace, name, template)
}

// createPodOn is createPod on another control plane.
func createPodOn(t testing.TB, ctx context.Context, c *framework.ControlPlane, namespace, name, template string) {
	t.Helper()
	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: v1.PodSpec{
			Containers: []v1.Container{{
				Name: "ctr", Image: "registry.k8s.io/pause:3.10",
				Resources: v1.ResourceRequirements{Claims: []v1.ResourceClaim{{Name: "gpu"}}},
			}},
			ResourceClaims: []v1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: &template}},
		},
	}
	if _, err := c.Client.CoreV1().Pods(namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating pod: %v", err)
	}
}
