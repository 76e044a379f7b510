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
	rbacv1 "k8s.io/api/rbac/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"

	"github.com/gpuaas/gpu-dra-driver/pkg/mps"
	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

// testMPSCaps (issue 53 item 1, as it was reproduced on the real node): a
// tenant, with its own identity, claims a 1Gi MPS share of the MPS GPU and
// asks, in its claim's config, for all of the GPU's threads. The claim
// webhook refuses it, naming the cap its share gives (a 1Gi share of an
// 80 GB GPU: 2%). A claim within the cap is prepared with the lower
// percentage in its CDI spec, and the GPU's MPS daemon keeps the node
// configuration's default, not the claim's.
func testMPSCaps(t *testing.T, n *realNode) {
	ctx := framework.Context(t, 4*time.Minute)
	applySharingClasses(t, ctx)
	if !suiteShape(t).shares {
		checkNotPublished(t, ctx, n.Name, mpsGPU)
		return
	}
	ns := cp.CreateNamespace(t, "real-mps-caps")
	const user = "mps-tenant"
	grantClaims(t, ctx, ns, user)
	tenant := impersonating(t, user)

	greedy := mpsShareClaim(ns, "greedy", 100)
	_, err := tenant.ResourceV1().ResourceClaims(ns).Create(ctx, greedy, metav1.CreateOptions{})
	const want = "mpsConfig.defaultActiveThreadPercentage 100 is above the cap of"
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "the device's share of its GPU") {
		t.Fatalf("%s creating a 1Gi MPS share asking 100%% of the GPU's threads: %v; want it refused as invalid, naming the share's cap (%q)", user, err, want)
	}
	t.Logf("refused: %v", err)

	modest, err := tenant.ResourceV1().ResourceClaims(ns).Create(ctx, mpsShareClaim(ns, "modest", 1), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("%s creating a 1Gi MPS share asking 1%% of the threads: %v", user, err)
	}
	pod := workloadPod(ns, "modest")
	pod.Spec.ResourceClaims = []v1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To(modest.Name)}}
	pod.Spec.Containers[0].Resources.Claims = []v1.ResourceClaim{{Name: "gpu"}}
	pod = createAndRun(t, ctx, pod)
	defer deletePodAndWait(t, ctx, pod)
	modest, err = cp.Client.ResourceV1().ResourceClaims(ns).Get(ctx, modest.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var env []string
	for _, e := range specDeviceEnv(t, n, modest) {
		env = append(env, e...)
	}
	if !slices.Contains(env, mps.EnvThreads+"=1") {
		t.Errorf("the CDI spec of claim %s (asking 1%%) gives %v; want %s=1", modest.Name, env, mps.EnvThreads)
	}
	// The daemon's default binds a client that drops the variable: the
	// node configuration's largest share, never what a claim asked.
	mpsDir := filepath.Join(n.KubeletDir, "plugins", framework.DriverName, "mps")
	uuid := gpuUUIDOf(t, ctx, n.Name, mpsGPU)
	largest, total := largestShare(t, ctx, n.Name, mpsGPU)
	wantPct := min(100, (largest*100+total-1)/total)
	if got := askMPSDaemon(t, ctx, n, mpsDir, uuid, "get_default_active_thread_percentage"); got != fmt.Sprintf("%d.0", wantPct) {
		t.Errorf("MPS daemon of %s: default thread percentage %q, want the node configuration's largest share's %d (the claim asked 1)", uuid, got, wantPct)
	}
}

// mpsShareClaim is a claim for a 1Gi share of the MPS GPU whose config asks
// for threads percent of the GPU's threads.
func mpsShareClaim(ns, name string, threads int) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{
				DeviceClassName: "shared.gpuaas.io",
				Selectors:       []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: onMPSGPU}}},
				Capacity: &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
					"memory": resource.MustParse("1Gi")}},
			}}},
			Config: []resourceapi.DeviceClaimConfiguration{{DeviceConfiguration: resourceapi.DeviceConfiguration{
				Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: framework.DriverName, Parameters: runtime.RawExtension{Raw: []byte(fmt.Sprintf(
					`{"apiVersion":"gpu.gpuaas.io/v1alpha1","kind":"GpuConfig","sharing":{"strategy":"MPS","mpsConfig":{"defaultActiveThreadPercentage":%d}}}`, threads))}},
			}}},
		}},
	}
}

// grantClaims lets user create and read ResourceClaims in ns, as a
// tenant's namespace role does.
func grantClaims(t *testing.T, ctx context.Context, ns, user string) {
	t.Helper()
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "claims", Namespace: ns}, Rules: []rbacv1.PolicyRule{{
		APIGroups: []string{resourceapi.GroupName}, Resources: []string{"resourceclaims", "resourceclaimtemplates"},
		Verbs: []string{"get", "list", "create", "delete"}}}}
	binding := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "claims", Namespace: ns},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name}}
	if _, err := cp.Client.RbacV1().Roles(ns).Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cp.Client.RbacV1().RoleBindings(ns).Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}
