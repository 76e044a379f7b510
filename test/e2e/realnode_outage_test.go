package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	admissionregv1 "k8s.io/api/admissionregistration/v1"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

const (
	controllerDeployment = releaseName + "-gpuaas-dra-controller"
	webhookConfigName    = releaseName + "-gpuaas-dra-quota"
	foreignClass         = "nic.example.com"
)

// testForeignClaimsDuringOutage: with the controller down, our fail-closed
// webhook refuses claims of our classes, but claims that can only reach
// another driver's classes never reach it (the matchCondition the
// controller keeps), so another driver keeps working. Before the
// condition, every claim in the cluster was refused while the controller
// was down.
func testForeignClaimsDuringOutage(t *testing.T, n *realNode) {
	ctx := framework.Context(t, 4*time.Minute)
	class := &resourceapi.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: foreignClass},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
			Expression: `device.driver == "nic.example.com"`}}}},
	}
	if _, err := cp.Client.ResourceV1().DeviceClasses().Create(ctx, class, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cp.Client.ResourceV1().DeviceClasses().Delete(context.Background(), foreignClass, metav1.DeleteOptions{})
	})
	took := waitForForeignCondition(t, ctx)
	t.Logf("claim webhook's matchCondition lists %s %v after the class was created", foreignClass, took)

	scaleController(t, ctx, 0)
	t.Cleanup(func() { scaleController(t, context.Background(), 1) })
	ns := cp.CreateNamespace(t, "outage")
	if err := createClaimOf(ctx, ns, "nic", foreignClass); err != nil {
		t.Fatalf("another driver's claim refused while our controller is down: %v", err)
	}
	err := createClaimOf(ctx, ns, "gpu", "gpu.gpuaas.io")
	if err == nil || !strings.Contains(err.Error(), "failed calling webhook") {
		t.Fatalf("our claim while the controller is down: %v, want the webhook's failure (fail closed)", err)
	}
	t.Logf("controller down: %s claim admitted, ours refused: %v", foreignClass, err)
	foreignClaimsAfterForcedUpgrade(t, ctx, n, ns)

	scaleController(t, ctx, 1)
	err = wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		return createClaimOf(ctx, ns, "gpu-again", "gpu.gpuaas.io") == nil, nil
	})
	if err != nil {
		t.Fatalf("our claims still refused after the controller came back: %v", err)
	}
}

// foreignClaimsAfterForcedUpgrade (issue 52 item 5): `helm upgrade
// --force` puts the chart's webhook configuration in place of the one the
// controller's leader keeps. With the controller unschedulable (a node
// selector no node has) nothing rewrites it, so what another driver's
// claims get is the chart's alone: the classes the values name
// (controller.webhook.foreignClasses) skip the fail-closed webhook, ours
// are refused. The suite's values are put back after.
func foreignClaimsAfterForcedUpgrade(t *testing.T, ctx context.Context, n *realNode, ns string) {
	t.Helper()
	helmUpgradeForced(t, n, "values-foreign-nowhere.yaml", //nolint:contextcheck // helm runs under a deadline of its own (helmOnCluster)
		"controller:\n  nodeSelector: {gpuaas.io/e2e-nowhere: \"true\"}\n  webhook:\n    foreignClasses: ["+foreignClass+"]\n")
	defer helmUpgradeForced(t, n, "values-none.yaml", "{}\n") //nolint:contextcheck // helm runs under a deadline of its own (helmOnCluster)
	cfg, err := cp.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, webhookConfigName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !claimWebhookNames(cfg, foreignClass) {
		t.Errorf("after helm upgrade --force the claim webhook's matchConditions do not name %s", foreignClass)
	}
	if err := createClaimOf(ctx, ns, "nic-after-upgrade", foreignClass); err != nil {
		t.Fatalf("another driver's claim after helm upgrade --force, the controller down: %v", err)
	}
	err = createClaimOf(ctx, ns, "gpu-after-upgrade", "gpu.gpuaas.io")
	if err == nil || !strings.Contains(err.Error(), "failed calling webhook") {
		t.Fatalf("our claim after helm upgrade --force, the controller down: %v, want the webhook's failure (fail closed)", err)
	}
	t.Logf("after helm upgrade --force with the controller down: %s claim admitted (the chart's matchCondition), ours refused", foreignClass)
}

// helmUpgradeForced runs `helm upgrade --force` of the release with the
// suite's values and extra (a values file named name) over them.
func helmUpgradeForced(t *testing.T, n *realNode, name, extra string) {
	t.Helper()
	files := make([]string, 0, 2)
	for _, v := range []struct{ name, values string }{{"values-suite.yaml", n.values}, {name, extra}} {
		f, err := n.WriteValues(v.name, v.values)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	helmOnCluster(t, append([]string{"upgrade", releaseName, chartPath, "--namespace", releaseNamespace, "--force"}, valueArgs(files)...)...)
}

// waitForForeignCondition waits until the live claim webhook's
// matchConditions name the foreign class.
func waitForForeignCondition(t *testing.T, ctx context.Context) time.Duration {
	t.Helper()
	start := time.Now()
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		cfg, err := cp.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, webhookConfigName, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return claimWebhookNames(cfg, foreignClass), nil
	})
	if err != nil {
		t.Fatalf("the claim webhook's matchConditions never named %s: %v", foreignClass, err)
	}
	return time.Since(start)
}

func claimWebhookNames(cfg *admissionregv1.ValidatingWebhookConfiguration, class string) bool {
	for _, wh := range cfg.Webhooks {
		if wh.Name != "resourceclaims.quota.gpuaas.io" {
			continue
		}
		for _, c := range wh.MatchConditions {
			if strings.Contains(c.Expression, `"`+class+`"`) {
				return true
			}
		}
	}
	return false
}

func createClaimOf(ctx context.Context, ns, name, class string) error {
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{Name: "dev", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: class}}},
		}},
	}
	_, err := cp.Client.ResourceV1().ResourceClaims(ns).Create(ctx, claim, metav1.CreateOptions{})
	return err
}

// scaleController sets the chart's controller replicas and waits until
// exactly that many controller pods exist (ready, when any).
func scaleController(t *testing.T, ctx context.Context, replicas int) {
	t.Helper()
	patch := []byte(fmt.Sprintf(`{"spec":{"replicas":%d}}`, replicas))
	if _, err := cp.Client.AppsV1().Deployments(releaseNamespace).Patch(ctx, controllerDeployment, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		pods, err := cp.ComponentPods(ctx, releaseNamespace, "controller")
		if err != nil || len(pods) != replicas {
			return false, err
		}
		for _, p := range pods {
			if p.Status.PodIP == "" || !podReady(&p) {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("scaling the controller to %d: %v", replicas, err)
	}
	if replicas > 0 {
		waitClaimWebhookServes(t, ctx)
	}
}

// waitClaimWebhookServes waits until the apiserver reaches the claim
// webhook: a pod that is Ready is not yet an endpoint the apiserver knows
// (the EndpointSlice and the apiserver's view of it follow), and after a
// reboot the pod's Ready is the one from before until its kubelet reports
// again. Seen: "no endpoints available for service" right after Ready.
func waitClaimWebhookServes(t *testing.T, ctx context.Context) {
	t.Helper()
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "webhook-probe-", Namespace: metav1.NamespaceDefault},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{Name: "dev", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu.gpuaas.io"}}},
		}},
	}
	var last error
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		_, last = cp.Client.ResourceV1().ResourceClaims(claim.Namespace).Create(ctx, claim, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		// Any answer of the webhook's own (a quota refusal too) means it serves.
		return last == nil || !strings.Contains(last.Error(), "failed calling webhook"), nil
	})
	if err != nil {
		t.Fatalf("the claim webhook does not serve: %v (last: %v)", err, last)
	}
}

func podReady(p *v1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == v1.PodReady {
			return c.Status == v1.ConditionTrue
		}
	}
	return false
}
