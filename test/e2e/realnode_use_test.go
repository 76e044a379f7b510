package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev/nvmock"
	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

// trainerSM is the SM utilization the simulated GPU reports for the busy
// trainer's container process.
const trainerSM = 70

// testUseAndIdlePolicy: what the chart's plugin measures of two pods on one
// time-sliced GPU, through the production NVML path (the simulated
// libnvidia-ml.so.1), and what the chart's controller does with it. The
// trainer's container's host PID runs at 70% of the GPU (set on the
// simulated machine, as a CUDA process would show in NVML), the notebook's
// runs nothing: the plugin maps the PID through /proc/<pid>/cgroup to the
// trainer's pod and claim, so the metrics put 70% on the trainer's claim and
// 0 on the notebook's. Under a tenant policy of 5% for 1m with Evict, the
// notebook's pod is evicted with an event naming the policy, and the
// trainer keeps running.
func testUseAndIdlePolicy(t *testing.T, n *realNode) {
	ctx := framework.Context(t, 6*time.Minute)
	applySharingClasses(t, ctx)
	ns := cp.CreateNamespace(t, "real-use")
	tenant := uniqueName("real-use")
	q := quotaFor(tenant, []string{ns}, gpuaas.QuotaLimits{})
	q.Spec.IdlePolicy = &gpuaas.IdlePolicy{ThresholdPercent: 5, Duration: metav1.Duration{Duration: time.Minute}, Action: gpuaas.IdleActionEvict}
	createObject(t, q)
	waitForQuotaNamespace(t, tenant, ns)

	gpu := gpuUUIDOf(t, ctx, n.Name, longIntervalGPU)
	pods := map[string]*v1.Pod{}
	for _, name := range []string{"trainer", "notebook"} {
		tmpl := templateFor(name, ns, "timeslice.gpuaas.io")
		tmpl.Spec.Spec.Devices.Requests[0].Exactly.Selectors = celSelectors(onLongGPU)
		if _, err := cp.Client.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		pods[name] = createAndRun(t, ctx, templateWorkloadPod(ns, name, name))
	}
	trainer, notebook := pods["trainer"], pods["notebook"]
	pid, err := framework.ContainerHostPID("/proc", trainer.Status.ContainerStatuses[0].ContainerID)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Machine().SetProcessUse(gpu, nvmock.ProcessUse{PID: pid, Name: "python", SMUtil: trainerSM, MemoryUsed: 2 << 30}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Machine().EndProcess(pid) })
	t.Logf("the trainer's container process %d runs at %d%% of GPU %s", pid, trainerSM, gpu)

	want := map[string]float64{"trainer": trainerSM, "notebook": 0}
	got := waitForClaimUse(t, ctx, ns, want)
	t.Logf("the plugin measured, per pod on GPU %s: %v", gpu, got)

	err = wait.PollUntilContextCancel(ctx, time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := cp.Client.CoreV1().Pods(ns).Get(ctx, notebook.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		t.Fatalf("the idle notebook was not evicted: %v", err)
	}
	if _, err := cp.WaitForEvent(ctx, ns, "Pod", notebook.Name, "IdleEvicted", "policy tenantquota/"+tenant, "below 5% for 1m0s"); err != nil {
		t.Error(err)
	}
	p, err := cp.Client.CoreV1().Pods(ns).Get(ctx, trainer.Name, metav1.GetOptions{})
	if err != nil || p.UID != trainer.UID || p.DeletionTimestamp != nil || p.Status.Phase != v1.PodRunning {
		t.Errorf("the busy trainer: %v; want it running", err)
	}
	deletePodAndWait(t, ctx, trainer)
}

// waitForClaimUse scrapes the chart's plugin until its utilization series
// for the pods of ns are those of want (pod name -> percent of the GPU),
// and returns what it read last.
func waitForClaimUse(t *testing.T, ctx context.Context, ns string, want map[string]float64) map[string]float64 {
	t.Helper()
	plugin := waitForPluginPod(t, ctx, "")
	var got map[string]float64
	var last error
	err := wait.PollUntilContextTimeout(ctx, 2*time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		body, err := scrapeComponent(ctx, plugin, "kubelet-plugin", "")
		if err != nil {
			last = err
			return false, nil
		}
		got, last = claimUtilization(body, ns)
		if last != nil || len(got) != len(want) {
			return false, nil
		}
		for pod, pct := range want {
			if v, ok := got[pod]; !ok || v != pct {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("the plugin's gpuaas_claim_gpu_utilization_percent for namespace %s: %v, want %v (%v)", ns, got, want, last)
	}
	return got
}

// claimUtilization reads gpuaas_claim_gpu_utilization_percent of a
// namespace's pods from a /metrics page, by pod name.
func claimUtilization(body, ns string) (map[string]float64, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("parsing /metrics: %w", err)
	}
	out := map[string]float64{}
	f := families["gpuaas_claim_gpu_utilization_percent"]
	if f == nil {
		return out, nil
	}
	for _, m := range f.GetMetric() {
		labels := labelMap(m.GetLabel())
		if labels["namespace"] == ns && m.GetGauge() != nil {
			out[labels["pod"]] = m.GetGauge().GetValue()
		}
	}
	return out, nil
}

func labelMap(pairs []*dto.LabelPair) map[string]string {
	out := make(map[string]string, len(pairs))
	for _, p := range pairs {
		out[p.GetName()] = p.GetValue()
	}
	return out
}
