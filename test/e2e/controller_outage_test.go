package e2e

import (
	"cmp"
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/gpuaas/gpu-dra-driver/pkg/controller"
	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

// Issue 26 item 8: the webhook configuration the controller writes itself
// (no chart: the demo, the tests) must keep other drivers' claims away from
// the fail-closed claim webhook like the chart's does, or a controller that
// dies without removing it blocks every driver's claims. It gets the same
// matchCondition: with the controller killed (its configuration left
// behind), a claim of another driver's class is created and one of ours is
// refused.
func TestSelfWrittenWebhookConfigSparesOtherDrivers(t *testing.T) {
	name := uniqueName("self-written")
	rc := startControllerWith(t, func(o *controller.Options) {
		o.Webhook.ConfigName, o.Webhook.RemoveOnExit = name, false // as if killed
	})
	ctx := framework.Context(t, 3*time.Minute)
	t.Cleanup(func() {
		ctx := context.Background()
		_ = cp.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Delete(ctx, name, metav1.DeleteOptions{})
		_ = cp.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Delete(ctx, name, metav1.DeleteOptions{})
	})
	foreign := uniqueName("nic.example.com")
	dc := &resourceapi.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: foreign},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
			Expression: `device.driver == "nic.example.com"`,
		}}}},
	}
	if _, err := cp.Client.ResourceV1().DeviceClasses().Create(ctx, dc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cp.Client.ResourceV1().DeviceClasses().Delete(context.Background(), foreign, metav1.DeleteOptions{})
	})
	err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		cfg, err := cp.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		return claimWebhookNames(cfg, foreign), nil
	})
	if err != nil {
		t.Fatalf("the self-written claim webhook's matchConditions never named %s: %v", foreign, err)
	}
	rc.stop(t)
	if _, err := cp.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, name, metav1.GetOptions{}); err != nil {
		t.Fatalf("the configuration should outlive the controller here: %v", err)
	}
	ns := cp.CreateNamespace(t, "self-written")
	if err := createClaimOf(ctx, ns, "nic", foreign); err != nil {
		t.Errorf("controller down: a claim of another driver's class was refused: %v", err)
	}
	err = createClaimOf(ctx, ns, "gpu", "gpu.gpuaas.io")
	if err == nil {
		t.Error("controller down: a claim of our class was admitted, want the webhook to fail closed")
	}
	t.Logf("controller down: %s admitted, ours refused: %v", foreign, err)
}

// apiServerDownAtStart is how long the controller's API server refuses
// connections in TestControllerWaitsForTheAPIServerAtStart: long enough
// for several retries.
const apiServerDownAtStart = 5 * time.Second

// Issue 39: a controller started while the API server was unreachable (a
// control-plane upgrade; the controller restarted after losing its lease
// in the outage) exited with "reading CRD ...: connection refused", and
// the kubelet's CrashLoopBackOff then kept it down for minutes after the
// API server was back. It waits instead, says what it waits for, and
// starts serving once the API server answers.
func TestControllerWaitsForTheAPIServerAtStart(t *testing.T) {
	installCRDs(t)
	ports, err := framework.FreePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", ports[0]) // nothing listens: connections are refused
	cfg := rest.CopyConfig(cp.Config)
	cfg.Host = "https://" + addr
	opts := controllerOptions(t)
	opts.ApplyCRDs = true
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.Verbosity(2), ktesting.BufferLogs(true)))
	// Registered first, so run last: when the test stops early, the relay
	// is closed before the controller stops, and its RemoveOnExit cannot
	// reach the API server; a webhook configuration left pointing at its
	// port refused every claim of the later tests.
	t.Cleanup(func() { deleteWebhookConfigs(t, cmp.Or(opts.Webhook.ConfigName, controller.DefaultWebhookConfigName)) })
	rc := runController(t, klog.NewContext(context.Background(), logger), cfg, opts)
	deadline := time.Now().Add(apiServerDownAtStart)
	for time.Now().Before(deadline) {
		rc.alive(t)
		time.Sleep(100 * time.Millisecond)
	}
	sw, err := framework.ListenTCPSwitch(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sw.Close() })
	apiServer, err := url.Parse(cp.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	sw.SwitchTo(apiServer.Host)
	if err := waitForWebhook(t, rc); err != nil {
		t.Fatal(err)
	}
	logs := logger.GetSink().(ktesting.Underlier).GetBuffer().String()
	for _, want := range []string{"Waiting for the API server", "connection refused"} {
		if !strings.Contains(logs, want) {
			t.Errorf("the controller's log while the API server was down does not say %q", want)
		}
	}
	rc.stop(t) // while the relay is open, so that it removes its webhook configuration itself
}

// deleteWebhookConfigs removes the webhook configurations named name, if any.
func deleteWebhookConfigs(t *testing.T, name string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(t.Context()), 30*time.Second)
	defer cancel()
	if err := cp.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("deleting ValidatingWebhookConfiguration %s: %v", name, err)
	}
	if err := cp.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("deleting MutatingWebhookConfiguration %s: %v", name, err)
	}
}
