package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/controller"
	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
	"github.com/gpuaas/gpu-dra-driver/test/kubeletsim"
)

// The dra-controller runs in the test process against the real control
// plane: its webhook listens on 127.0.0.1, the webhook configuration it
// writes points the kube-apiserver there (--webhook-url), and it removes
// that configuration when it stops, so tests that run without it are not
// blocked by a webhook that fails closed.

var (
	crdOnce sync.Once
	crdErr  error
	// ctrlClient reads and writes our CRDs (typed), created with the CRDs.
	ctrlClient client.Client
)

// installCRDs applies config/crd once per test binary and waits until the
// types are served.
func installCRDs(t testing.TB) client.Client {
	t.Helper()
	crdOnce.Do(func() {
		ctrl.SetLogger(klog.Background().WithName("controller-runtime"))
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, crdErr = cp.Apply(ctx, filepath.Join(repoRoot, "config", "crd"), ""); crdErr != nil {
			return
		}
		scheme, err := controller.Scheme()
		if err != nil {
			crdErr = err
			return
		}
		if ctrlClient, crdErr = client.New(cp.Config, client.Options{Scheme: scheme}); crdErr != nil {
			return
		}
		crdErr = wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
			a := ctrlClient.List(ctx, &gpuaas.GpuProfileList{})
			b := ctrlClient.List(ctx, &gpuaas.TenantQuotaList{})
			return a == nil && b == nil, nil
		})
	})
	if crdErr != nil {
		t.Fatalf("installing CRDs: %v", crdErr)
	}
	return ctrlClient
}

// runningController is one dra-controller in this process.
type runningController struct {
	cancel context.CancelFunc
	done   chan error
}

// startController installs the CRDs, starts a controller and waits until
// the kube-apiserver calls its webhook. It is stopped when the test ends
// (or earlier with stop).
func startController(t testing.TB) *runningController {
	t.Helper()
	return startControllerWith(t, nil)
}

// startControllerWith is startController with options changed by set.
func startControllerWith(t testing.TB, set func(*controller.Options)) *runningController {
	t.Helper()
	installCRDs(t)
	opts := controllerOptions(t)
	if set != nil {
		set(&opts)
	}
	ctx := klog.NewContext(context.Background(), klog.Background().WithName("dra-controller"))
	rc := runController(t, ctx, cp.Config, opts)
	if err := waitForWebhook(t, rc); err != nil {
		t.Fatal(err)
	}
	return rc
}

// runController runs a controller against the API server cfg names until
// the test ends (or stop), and does not wait for it.
func runController(t testing.TB, ctx context.Context, cfg *rest.Config, opts controller.Options) *runningController {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	rc := &runningController{cancel: cancel, done: make(chan error, 1)}
	go func() { rc.done <- controller.Run(ctx, cfg, opts) }()
	t.Cleanup(func() { rc.stop(t) })
	return rc
}

// controllerOptions are a test controller's: its webhook on a free port of
// 127.0.0.1, its configuration removed when it stops.
func controllerOptions(t testing.TB) controller.Options {
	t.Helper()
	ports, err := framework.FreePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	return controller.Options{
		MetricsAddr: "0", HealthAddr: "0", NudgeWaitingPods: true, Resync: 5 * time.Second,
		Webhook: controller.WebhookOptions{
			Host: "127.0.0.1", Port: ports[0], CertDir: t.TempDir(),
			URL: fmt.Sprintf("https://127.0.0.1:%d", ports[0]), RemoveOnExit: true,
		},
	}
}

// stop ends the controller and checks it did not fail on its own.
func (rc *runningController) stop(t testing.TB) {
	t.Helper()
	if rc.cancel == nil {
		return
	}
	rc.cancel()
	rc.cancel = nil
	select {
	case err := <-rc.done:
		if err != nil {
			t.Errorf("controller ended with: %v", err)
		}
	case <-time.After(time.Minute):
		t.Error("controller did not stop within a minute")
	}
}

// alive fails the test if the controller exited (crashed) by itself.
func (rc *runningController) alive(t testing.TB) {
	t.Helper()
	select {
	case err := <-rc.done:
		rc.cancel = nil
		t.Fatalf("controller exited: %v", err)
	default:
	}
}

// waitForWebhook waits until the kube-apiserver routes requests to the
// webhook: a server-side dry run of a template with a bad opaque config is
// refused by it, with the field named.
func waitForWebhook(t testing.TB, rc *runningController) error {
	t.Helper()
	ctx := framework.Context(t, time.Minute)
	tmpl := &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: "webhook-probe", Namespace: "default"},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Config: []resourceapi.DeviceClaimConfiguration{{DeviceConfiguration: resourceapi.DeviceConfiguration{
				Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: framework.DriverName,
					Parameters: runtime.RawExtension{Raw: []byte(`{"apiVersion":"gpu.gpuaas.io/v1alpha1","kind":"GpuConfig","probe":1}`)}},
			}}},
		}}},
	}
	var last error
	err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		rc.alive(t)
		_, last = cp.Client.ResourceV1().ResourceClaimTemplates("default").Create(ctx, tmpl, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return last != nil && strings.Contains(last.Error(), `unknown field "probe"`), nil
	})
	if err != nil {
		return fmt.Errorf("webhook not called by the apiserver (last answer: %w): %w", last, err)
	}
	return nil
}

// createObject creates one of our objects and deletes it when the test
// ends.
func createObject(t testing.TB, obj client.Object) {
	t.Helper()
	ctx := framework.Context(t, 30*time.Second)
	// installCRDs makes ctrlClient: a test that creates our objects before
	// any controller test ran (TestKueue alone) found it nil.
	if err := installCRDs(t).Create(ctx, obj); err != nil {
		t.Fatalf("creating %T %s: %v", obj, obj.GetName(), err)
	}
	deleteAtCleanup(t, obj)
}

func deleteAtCleanup(t testing.TB, obj client.Object) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := ctrlClient.Delete(ctx, obj); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("deleting %s: %v", obj.GetName(), err)
		}
	})
}

// uniqueName makes a cluster-scoped name (profile, quota) unique, so a
// test never sees another's leftovers.
func uniqueName(base string) string {
	return fmt.Sprintf("%s-%d", base, time.Now().UnixNano()%1_000_000)
}

func profile(name string, sel gpuaas.ProfileSelector) *gpuaas.GpuProfile {
	return &gpuaas.GpuProfile{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: gpuaas.GpuProfileSpec{Selector: sel}}
}

func quotaFor(name string, namespaces []string, limits gpuaas.QuotaLimits) *gpuaas.TenantQuota {
	return &gpuaas.TenantQuota{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: gpuaas.TenantQuotaSpec{Namespaces: namespaces, Limits: limits}}
}

// waitForProfileReady waits for the profile's DeviceClass.
func waitForProfileReady(t *testing.T, name string) *gpuaas.GpuProfile {
	t.Helper()
	return waitForProfile(t, name, "Ready", func(p *gpuaas.GpuProfile) bool {
		c := findCondition(p.Status.Conditions, gpuaas.ConditionReady)
		return c != nil && c.Status == metav1.ConditionTrue
	})
}

func waitForProfile(t testing.TB, name, what string, cond func(*gpuaas.GpuProfile) bool) *gpuaas.GpuProfile {
	t.Helper()
	ctx := framework.Context(t, time.Minute)
	var p gpuaas.GpuProfile
	err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		if err := ctrlClient.Get(ctx, types.NamespacedName{Name: name}, &p); err != nil {
			return false, client.IgnoreNotFound(err)
		}
		return cond(&p), nil
	})
	if err != nil {
		t.Fatalf("GpuProfile %s not %s: %v; status %+v", name, what, err, p.Status)
	}
	return &p
}

func waitForQuota(t testing.TB, name, what string, cond func(*gpuaas.TenantQuota) bool) *gpuaas.TenantQuota {
	t.Helper()
	ctx := framework.Context(t, time.Minute)
	var q gpuaas.TenantQuota
	err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		if err := ctrlClient.Get(ctx, types.NamespacedName{Name: name}, &q); err != nil {
			return false, client.IgnoreNotFound(err)
		}
		return cond(&q), nil
	})
	if err != nil {
		t.Fatalf("TenantQuota %s not %s: %v; status %+v", name, what, err, q.Status)
	}
	return &q
}

func findCondition(conds []metav1.Condition, typ string) *metav1.Condition {
	for i := range conds {
		if conds[i].Type == typ {
			return &conds[i]
		}
	}
	return nil
}

// usedUnits is status.used.gpuUnits as a string ("" when unset).
func usedUnits(q *gpuaas.TenantQuota) string {
	if q.Status.Used.GpuUnits == nil {
		return ""
	}
	return q.Status.Used.GpuUnits.String()
}

// gpuClaim is a ResourceClaim for count devices of class.
func gpuClaim(namespace, name, class string, count int64) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{
				DeviceClassName: class, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: count,
			},
		}}}},
	}
}

func createClaim(ctx context.Context, c *resourceapi.ResourceClaim) error {
	_, err := cp.Client.ResourceV1().ResourceClaims(c.Namespace).Create(ctx, c, metav1.CreateOptions{})
	return err
}

// mustDeny expects the webhook to refuse err's request with a message
// containing every part.
func mustDeny(t *testing.T, err error, parts ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("created, want a denial containing %q", parts)
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Fatalf("denial %q lacks %q", err.Error(), p)
		}
	}
	t.Logf("denied as expected: %v", err)
}

// claimPod is a pod using an existing claim (resourceClaimName) or a
// template.
func claimPod(namespace, name, claim, template string) *v1.Pod {
	pc := v1.PodResourceClaim{Name: "gpu"}
	if claim != "" {
		pc.ResourceClaimName = ptr.To(claim)
	} else {
		pc.ResourceClaimTemplateName = ptr.To(template)
	}
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: v1.PodSpec{
			Containers: []v1.Container{{
				Name: "ctr", Image: "registry.k8s.io/pause:3.10",
				Resources: v1.ResourceRequirements{Claims: []v1.ResourceClaim{{Name: "gpu"}}},
			}},
			ResourceClaims:                []v1.PodResourceClaim{pc},
			TerminationGracePeriodSeconds: ptr.To[int64](0),
		},
	}
}

// fakeGPUNode is a node whose ResourceSlice the test writes by hand (MIG
// devices before the plugin publishes them): the kubelet simulator keeps
// the Node ready, no plugin runs, so pods get their claims allocated by
// the scheduler but never start. Its pods are force-deleted at cleanup.
func fakeGPUNode(t *testing.T, devices ...resourceapi.Device) string {
	t.Helper()
	name := strings.TrimPrefix(nodeName(t), "node-")
	name = "fake-" + name[:min(len(name), 40)]
	sim, err := kubeletsim.New(kubeletsim.Config{Client: cp.Client, NodeName: name, RegistryDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	simCtx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sim.Run(simCtx) }()
	t.Cleanup(func() { stopFakeNode(t, name, cancel, done) })
	ctx := framework.Context(t, time.Minute)
	select {
	case <-sim.Synced():
	case err := <-done:
		t.Fatalf("node simulator: %v", err)
	case <-ctx.Done():
		t.Fatal("node simulator did not start")
	}
	if err := cp.WaitForNodeSchedulable(ctx, name); err != nil {
		t.Fatal(err)
	}
	slice := &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name + "-gpus"},
		Spec: resourceapi.ResourceSliceSpec{
			Driver: framework.DriverName, NodeName: ptr.To(name),
			Pool:    resourceapi.ResourcePool{Name: name, Generation: 1, ResourceSliceCount: 1},
			Devices: devices,
		},
	}
	if _, err := cp.Client.ResourceV1().ResourceSlices().Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		t.Fatalf("publishing slice: %v", err)
	}
	return name
}

func stopFakeNode(t *testing.T, name string, cancel context.CancelFunc, done chan error) {
	ctx, cancelCtx := context.WithTimeout(context.Background(), time.Minute)
	defer cancelCtx()
	pods, err := cp.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + name})
	if err == nil {
		for _, p := range pods.Items {
			_ = cp.Client.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("node simulator: %v", err)
	}
	err = cp.Client.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("deleting node: %v", err)
	}
	err = cp.Client.ResourceV1().ResourceSlices().Delete(ctx, name+"-gpus", metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("deleting slice: %v", err)
	}
}

// waitForAllocation waits until the scheduler allocated a claim.
func waitForAllocation(t *testing.T, ctx context.Context, namespace, name string) *resourceapi.ResourceClaim {
	t.Helper()
	var c *resourceapi.ResourceClaim
	err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		var err error
		c, err = cp.Client.ResourceV1().ResourceClaims(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, client.IgnoreNotFound(err)
		}
		return c.Status.Allocation != nil, nil
	})
	if err != nil {
		t.Fatalf("claim %s/%s not allocated: %v", namespace, name, err)
	}
	return c
}
