package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	admissionregv1 "k8s.io/api/admissionregistration/v1"
	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

// testControllerLeastPrivilege acts as the chart's controller account
// (impersonated): it may set the quota-retry annotation on a pod and
// nothing else on it, and may not create a webhook configuration
// (issue 12 item 4).
func testControllerLeastPrivilege(t *testing.T, n *realNode) {
	ctx := framework.Context(t, 2*time.Minute)
	dep := renderedControllerDeployment(t, ctx, n)
	as := impersonating(t, "system:serviceaccount:"+releaseNamespace+":"+dep.Spec.Template.Spec.ServiceAccountName)
	ns := cp.CreateNamespace(t, "privilege")
	pod := heldPod(t, ctx, ns)

	_, err := as.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, &admissionregv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "takeover"}}, metav1.CreateOptions{})
	mustBeForbidden(t, "creating a webhook configuration", err, "")
	_, err = as.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(ctx, &admissionregv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "takeover"}}, metav1.CreateOptions{})
	mustBeForbidden(t, "creating a mutating webhook configuration", err, "")

	patches := []struct {
		what, patch string
		allowed     bool
	}{
		{"the quota-retry annotation", `{"metadata":{"annotations":{"` + gpuaas.QuotaRetryAnnotation + `":"1"}}}`, true},
		{"a container image", `{"spec":{"containers":[{"name":"c","image":"attacker/miner"}]}}`, false},
		{"a label", `{"metadata":{"labels":{"app":"payments"}}}`, false},
		{"another annotation", `{"metadata":{"annotations":{"other":"x"}}}`, false},
	}
	for _, p := range patches {
		_, err := as.CoreV1().Pods(ns).Patch(ctx, pod, types.StrategicMergePatchType, []byte(p.patch), metav1.PatchOptions{})
		if p.allowed {
			if err != nil {
				t.Errorf("the controller's account setting %s: %v", p.what, err)
			}
			continue
		}
		mustBeForbidden(t, "the controller's account changing "+p.what, err, "may only set the annotation")
	}
	got, err := cp.Client.CoreV1().Pods(ns).Get(ctx, pod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if img := got.Spec.Containers[0].Image; strings.Contains(img, "attacker") {
		t.Errorf("pod image changed to %s", img)
	}
	checkControllerSlicesDryRunOnly(t, ctx, as, n.Name)
	// Whatever the controller did since the install, the chart's RBAC
	// allowed it (issue 12 item 14: leader election's events were not).
	for _, line := range controllerLogLines(t, n, "is forbidden") {
		t.Errorf("the chart's RBAC refused the controller: %s", line)
	}
}

// checkControllerSlicesDryRunOnly: the controller's token may dry-run a
// ResourceSlice create (its cluster feature probe), and nothing more: a real
// create of a slice that offers a node's GPUs is refused by the chart's
// policy, and it may not delete the node's slices (issue 35 item 2).
func checkControllerSlicesDryRunOnly(t *testing.T, ctx context.Context, as kubernetes.Interface, node string) {
	t.Helper()
	slice := &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{GenerateName: node + "-forged-"},
		Spec: resourceapi.ResourceSliceSpec{Driver: framework.DriverName, NodeName: &node,
			Pool:    resourceapi.ResourcePool{Name: node, ResourceSliceCount: 1},
			Devices: []resourceapi.Device{{Name: "gpu-forged"}}},
	}
	if _, err := as.ResourceV1().ResourceSlices().Create(ctx, slice, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
		t.Errorf("the controller's dry-run create of a ResourceSlice (its feature probe): %v", err)
	}
	_, err := as.ResourceV1().ResourceSlices().Create(ctx, slice, metav1.CreateOptions{})
	mustBeForbidden(t, "the controller's account creating a ResourceSlice", err, "may only dry-run ResourceSlice creates")
	err = as.ResourceV1().ResourceSlices().DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
	mustBeForbidden(t, "the controller's account deleting ResourceSlices", err, "")
}

// testNamespaceLabelsProtected: someone who may edit a namespace (a tenant's
// admin) cannot exempt it from quota nor move it to another tenant by its
// labels; other labels are theirs (issue 12 item 6).
func testNamespaceLabelsProtected(t *testing.T, _ *realNode) {
	ctx := framework.Context(t, 2*time.Minute)
	ns := cp.CreateNamespace(t, "labels")
	const user = "tenant-admin"
	grantNamespaceEdit(t, ctx, user)
	as := impersonating(t, user)

	if _, err := cp.Client.CoreV1().Namespaces().Patch(ctx, ns, types.MergePatchType,
		[]byte(`{"metadata":{"labels":{"gpuaas.io/tenant":"team-a"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatalf("the cluster admin labelling the namespace: %v", err)
	}
	patches := []struct {
		what, patch string
		allowed     bool
	}{
		{"its own label", `{"metadata":{"labels":{"team":"vision"}}}`, true},
		{"the quota-exempt label", `{"metadata":{"labels":{"` + gpuaas.QuotaExemptLabel + `":"true"}}}`, false},
		{"the tenancy label to another tenant", `{"metadata":{"labels":{"gpuaas.io/tenant":"team-b"}}}`, false},
		{"the tenancy label away", `{"metadata":{"labels":{"gpuaas.io/tenant":null}}}`, false},
		// DRA's admin access: claims of such a namespace reach devices
		// others hold, and cost nothing (issue 26 item 7).
		{"the DRA admin-access label", `{"metadata":{"labels":{"resource.kubernetes.io/admin-access":"true"}}}`, false},
		{"the DRA admin-access label through status", `{"metadata":{"labels":{"resource.kubernetes.io/admin-access":"true"}}}`, false},
	}
	for _, p := range patches {
		var sub []string
		if strings.HasSuffix(p.what, "through status") {
			sub = []string{"status"}
		}
		got, err := as.CoreV1().Namespaces().Patch(ctx, ns, types.MergePatchType, []byte(p.patch), metav1.PatchOptions{}, sub...)
		if sub != nil && err == nil && got.Labels["resource.kubernetes.io/admin-access"] == "" {
			continue // the status strategy kept the labels: refused as well
		}
		if p.allowed {
			if err != nil {
				t.Errorf("%s setting %s: %v", user, p.what, err)
			}
			continue
		}
		mustBeForbidden(t, user+" changing "+p.what, err, "only a quota administrator may set or remove")
	}
}

// impersonating is a client acting as user, as the admin may.
func impersonating(t *testing.T, user string) kubernetes.Interface {
	t.Helper()
	cfg := rest.CopyConfig(cp.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user}
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// heldPod is a pod that stays unscheduled (a scheduling gate), to patch.
func heldPod(t *testing.T, ctx context.Context, ns string) string {
	t.Helper()
	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "workload", Namespace: ns},
		Spec: v1.PodSpec{
			SchedulingGates: []v1.PodSchedulingGate{{Name: "e2e.gpuaas.io/hold"}},
			Containers:      []v1.Container{{Name: "c", Image: "registry.example/app:1"}},
		},
	}
	if _, err := cp.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return pod.Name
}

// grantNamespaceEdit lets user get and patch every namespace, as a
// cluster's tenant admins often may.
func grantNamespaceEdit(t *testing.T, ctx context.Context, user string) {
	t.Helper()
	name := uniqueName("e2e-namespace-editor")
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: []rbacv1.PolicyRule{{
		APIGroups: []string{""}, Resources: []string{"namespaces", "namespaces/status"}, Verbs: []string{"get", "patch", "update"}}}}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name}}
	rbac := cp.Client.RbacV1()
	if _, err := rbac.ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := rbac.ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// The test's context may be done by now.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		_ = rbac.ClusterRoleBindings().Delete(ctx, name, metav1.DeleteOptions{})
		_ = rbac.ClusterRoles().Delete(ctx, name, metav1.DeleteOptions{})
	})
}

// mustBeForbidden expects a Forbidden answer whose message contains want.
func mustBeForbidden(t *testing.T, what string, err error, want string) {
	t.Helper()
	switch {
	case err == nil:
		t.Errorf("%s was allowed", what)
	case !apierrors.IsForbidden(err):
		t.Errorf("%s: want Forbidden, got %v", what, err)
	case !strings.Contains(err.Error(), want):
		t.Errorf("%s: refused, but not by the policy (%q lacks %q)", what, err, want)
	default:
		t.Logf("%s refused: %v", what, err)
	}
}
