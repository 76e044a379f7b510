package main

// The use and idle policy scenario (demo/usage): a notebook and a trainer
// on one time-sliced GPU of the real node, the trainer's container made
// busy on the simulated machine, what the node's plugin measured of each
// (the claims' Idle device condition, its per-claim metrics) and what the
// tenant's idle policy did (the Idle* events, the notebook evicted).

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/dynamic-resource-allocation/resourceclaim"

	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev/nvmock"
	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

// What demo/usage/use-and-idle.yaml makes, and what the demo does to it.
const (
	useFile      = "use-and-idle.yaml"
	useNamespace = "ml-notebooks"
	useTenant    = "ml-notebooks"
	useNotebook  = "notebook"
	useTrainer   = "trainer"
	// useGPU is the demo node's time-sliced GPU (demo/node-config.yaml),
	// where both pods' replicas are.
	useGPU = "4"
	// useTrainerSM is the SM utilization the trainer's process is given.
	useTrainerSM = 70
)

// useTrainerMemory is the memory the trainer's process is given, 2Gi.
const useTrainerMemory = 2 << 30

// Bounds of the scenario's waits. The plugin judges 30 s windows, and
// the policy acts a minute after the first idle window began: about 1.5
// minutes after the pods run.
const (
	usePodWait      = time.Minute
	useMeasuredWait = 2 * time.Minute
	useEvictWait    = 2 * time.Minute
	useGoneWait     = 30 * time.Second
)

// useScenario applies demo/usage on the real node, makes the trainer's
// container busy at useTrainerSM% on the simulated GPU, and prints what
// the plugin measured and what the idle policy did. The specs' pods are
// deleted first, as for the other scenarios, so that the time-sliced
// GPU's replicas are free; the scenario's pods are deleted at the end.
func (d *demo) useScenario(ctx context.Context, objs []*unstructured.Unstructured) error {
	if d.real == nil {
		d.out.printf("\nUse and idle policy: skipped (it runs a container's process on the real node's simulated GPU).\n")
		return nil
	}
	if err := d.freeSpecGPUs(ctx, objs, "Use and idle policy", "its pods get a time-sliced replica only if one is free"); err != nil {
		return err
	}
	root, err := framework.RepoRoot()
	if err != nil {
		return err
	}
	file := filepath.Join(root, "demo", "usage", useFile)
	if err := d.ensureProfiles(ctx, root, "Use and idle policy", file); err != nil {
		return err
	}
	d.out.printf("\nUse and idle policy (demo/usage): a notebook and a trainer on time-sliced GPU %s; TenantQuota %s: idle below 5%% for 1m, Evict ...\n",
		useGPU, useTenant)
	if err := d.applyUsePods(ctx, file); err != nil {
		return err
	}
	defer d.endUse(ctx)
	trainer, running, err := d.waitUsePods(ctx)
	if err != nil || !running {
		return err
	}
	pid, err := d.makeBusy(trainer)
	if err != nil {
		return err
	}
	d.usePID = pid
	if err := d.reportMeasured(ctx); err != nil {
		return err
	}
	return d.reportPolicy(ctx)
}

// applyUsePods applies the file's TenantQuota and template, waits until
// the controller has resolved the tenant's namespace (so that the pods'
// claims are charged to it and its policy applies), then the pods.
func (d *demo) applyUsePods(ctx context.Context, file string) error {
	objs, err := framework.ReadObjects(file)
	if err != nil {
		return err
	}
	var pods, rest []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == "Pod" {
			pods = append(pods, o)
		} else {
			rest = append(rest, o)
		}
	}
	if _, _, err := d.cp.ApplyObjects(ctx, file, rest, "default"); err != nil {
		return err
	}
	c, err := d.client()
	if err != nil {
		return err
	}
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		var q gpuaas.TenantQuota
		if err := c.Get(ctx, types.NamespacedName{Name: useTenant}, &q); err != nil {
			return false, nil
		}
		return slices.Contains(q.Status.Namespaces, useNamespace), nil
	})
	if err != nil {
		return fmt.Errorf("waiting for TenantQuota %s to resolve namespace %s: %w", useTenant, useNamespace, err)
	}
	if err := useWorkload(pods); err != nil {
		return err
	}
	_, _, err = d.cp.ApplyObjects(ctx, file, pods, "default")
	return err
}

// waitUsePods waits until both pods run and returns the trainer; running
// is false (with one line said) when they did not within usePodWait, as
// with specs of one's own that keep the replicas.
func (d *demo) waitUsePods(ctx context.Context) (*v1.Pod, bool, error) {
	pods := map[string]*v1.Pod{}
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, usePodWait, true, func(ctx context.Context) (bool, error) {
		for _, name := range []string{useNotebook, useTrainer} {
			pod, err := d.cp.Client.CoreV1().Pods(useNamespace).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			pods[name] = pod
		}
		return pods[useNotebook].Status.Phase == v1.PodRunning && runningContainerID(pods[useTrainer]) != "", nil
	})
	if wait.Interrupted(err) && ctx.Err() == nil {
		for _, name := range []string{useNotebook, useTrainer} {
			d.out.printf("  pod %s/%s after %s: %s\n", useNamespace, name, usePodWait, podState(ctx, d.cp, pods[name]))
		}
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("waiting for the pods of %s: %w", useNamespace, err)
	}
	return pods[useTrainer], true, nil
}

// runningContainerID is the containerd ID of a running pod's first
// container, "" until it runs.
func runningContainerID(pod *v1.Pod) string {
	if pod == nil || pod.Status.Phase != v1.PodRunning || len(pod.Status.ContainerStatuses) == 0 {
		return ""
	}
	s := pod.Status.ContainerStatuses[0]
	if s.State.Running == nil {
		return ""
	}
	_, id, _ := strings.Cut(s.ContainerID, "://")
	return id
}

// makeBusy runs the trainer's container's host PID on the simulated GPU at
// useTrainerSM% SM, as a CUDA process of it would show in NVML; the plugin
// maps it to the trainer's pod through /proc/<pid>/cgroup.
func (d *demo) makeBusy(trainer *v1.Pod) (uint32, error) {
	id := runningContainerID(trainer)
	pid, err := framework.ContainerHostPID("/proc", id)
	if err != nil {
		return 0, fmt.Errorf("the host PID of pod %s/%s: %w", trainer.Namespace, trainer.Name, err)
	}
	use := nvmock.ProcessUse{PID: pid, Name: "python", SMUtil: useTrainerSM, MemoryUsed: useTrainerMemory}
	if err := d.real.Machine().SetProcessUse(useGPU, use); err != nil {
		return 0, fmt.Errorf("making pod %s/%s busy: %w", trainer.Namespace, trainer.Name, err)
	}
	d.out.printf("  %s's container runs as host PID %d: on GPU %s at %d%% SM, 2Gi (mocknvml proc --gpu %s --pid %d --sm %d --mem-used 2Gi); %s does nothing\n",
		useTrainer, pid, useGPU, useTrainerSM, useGPU, pid, useTrainerSM, useNotebook)
	return pid, nil
}

// reportMeasured waits until the plugin has judged a window of each pod's
// claim, the notebook's idle and the trainer's in use, then prints each
// claim's Idle condition and the plugin's metrics of it.
func (d *demo) reportMeasured(ctx context.Context) error {
	var conds map[string]metav1.Condition
	err := wait.PollUntilContextTimeout(ctx, time.Second, useMeasuredWait, true, func(ctx context.Context) (bool, error) {
		var err error
		conds, err = d.idleConditions(ctx)
		if err != nil {
			return false, err
		}
		return conds[useNotebook].Status == metav1.ConditionTrue && conds[useTrainer].Status == metav1.ConditionFalse, nil
	})
	if err != nil && (!wait.Interrupted(err) || ctx.Err() != nil) {
		return err
	}
	if err != nil {
		d.out.printf("  after %s the plugin had not told idle from busy:\n", useMeasuredWait)
	} else {
		d.out.printf("  The plugin measured (Idle condition of each claim's device, written when it changes):\n")
	}
	for _, name := range []string{useNotebook, useTrainer} {
		d.out.printf("    %-8s %s\n", name, conditionLine(conds[name]))
	}
	families, err := d.scrapePlugin(ctx)
	if err != nil {
		d.out.printf("  plugin metrics: %v\n", err)
		return nil
	}
	d.out.printf("  and its /metrics, per claim:\n")
	for _, line := range claimUseLines(families, useNamespace) {
		d.out.printf("    %s\n", line)
	}
	return nil
}

// idleConditions are the Idle conditions of the pods' claims' first
// device, by pod; a pod, claim or condition not there yet is absent.
func (d *demo) idleConditions(ctx context.Context) (map[string]metav1.Condition, error) {
	out := map[string]metav1.Condition{}
	for _, name := range []string{useNotebook, useTrainer} {
		pod, err := d.cp.Client.CoreV1().Pods(useNamespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil, fmt.Errorf("getting pod %s/%s: %w", useNamespace, name, err)
		}
		claimName, _, err := resourceclaim.Name(pod, &pod.Spec.ResourceClaims[0])
		if err != nil || claimName == nil {
			continue
		}
		claim, err := d.cp.Client.ResourceV1().ResourceClaims(useNamespace).Get(ctx, *claimName, metav1.GetOptions{})
		if err != nil {
			return nil, fmt.Errorf("getting claim %s/%s: %w", useNamespace, *claimName, err)
		}
		if c := idleCondition(claim); c != nil {
			out[name] = *c
		}
	}
	return out, nil
}

// idleCondition is the Idle condition of a claim's first device of ours.
func idleCondition(claim *resourceapi.ResourceClaim) *metav1.Condition {
	for _, dev := range claim.Status.Devices {
		if dev.Driver == framework.DriverName {
			return apimeta.FindStatusCondition(dev.Conditions, gpuaas.DeviceConditionIdle)
		}
	}
	return nil
}

// conditionLine is an Idle condition in one line.
func conditionLine(c metav1.Condition) string {
	if c.Type == "" {
		return "no Idle condition yet"
	}
	return fmt.Sprintf("Idle=%s %s since %s: %s", c.Status, c.Reason, c.LastTransitionTime.UTC().Format(time.TimeOnly), c.Message)
}

// scrapePlugin reads the plugin's /metrics on the real node (its
// METRICS_ADDR on the host network, plain HTTP, as Prometheus scrapes it).
func (d *demo) scrapePlugin(ctx context.Context) (map[string]*dto.MetricFamily, error) {
	addr, err := d.pluginMetricsAddr(ctx)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://127.0.0.1"+addr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		return nil, fmt.Errorf("scraping the plugin: %w", err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scraping the plugin: HTTP %d", resp.StatusCode)
	}
	return parseMetrics(resp.Body)
}

func parseMetrics(r io.Reader) (map[string]*dto.MetricFamily, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("parsing the plugin's metrics: %w", err)
	}
	return families, nil
}

// claimUse is what the plugin's metrics say of one claim's device.
type claimUse struct {
	pod, claim, device, profile string
	util, perUnit, memory, idle *float64
	known                       *float64
}

// The plugin's per-claim metrics (docs/usage.md).
const (
	metricUtil    = "gpuaas_claim_gpu_utilization_percent"
	metricPerUnit = "gpuaas_claim_gpu_utilization_per_unit"
	metricMemory  = "gpuaas_claim_gpu_memory_used_bytes"
	metricIdle    = "gpuaas_claim_idle_seconds_total"
	metricKnown   = "gpuaas_claim_gpu_use_known"
)

// claimUseLines are the per-claim metrics of namespace, one line per
// claim and device, by pod.
func claimUseLines(families map[string]*dto.MetricFamily, namespace string) []string {
	uses := map[string]*claimUse{}
	for _, name := range []string{metricUtil, metricPerUnit, metricMemory, metricIdle, metricKnown} {
		f := families[name]
		if f == nil {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["namespace"] != namespace {
				continue
			}
			key := labels["claim"] + "/" + labels["device"]
			u := uses[key]
			if u == nil {
				u = &claimUse{claim: labels["claim"], device: labels["device"], profile: labels["profile"]}
				uses[key] = u
			}
			if labels["pod"] != "" {
				u.pod = labels["pod"]
			}
			value := metricValue(m)
			switch name {
			case metricUtil:
				u.util = &value
			case metricPerUnit:
				u.perUnit = &value
			case metricMemory:
				u.memory = &value
			case metricIdle:
				u.idle = &value
			case metricKnown:
				u.known = &value
			}
		}
	}
	list := make([]*claimUse, 0, len(uses))
	for _, u := range uses {
		list = append(list, u)
	}
	sort.Slice(list, func(i, j int) bool {
		if list[i].pod != list[j].pod {
			return list[i].pod < list[j].pod
		}
		return list[i].claim+list[i].device < list[j].claim+list[j].device
	})
	if len(list) == 0 {
		return []string{"no per-claim series of namespace " + namespace}
	}
	var lines []string
	for _, u := range list {
		lines = append(lines, fmt.Sprintf("%-8s claim %s, %s (%s): SM %s%% of the GPU, %s per GPU unit, memory %s, idle %ss, use known %s",
			orDash(u.pod), u.claim, u.device, u.profile, gauge(u.util), gauge(u.perUnit), bytesOf(u.memory), gauge(u.idle), gauge(u.known)))
	}
	return lines
}

func metricValue(m *dto.Metric) float64 {
	switch {
	case m.GetGauge() != nil:
		return m.GetGauge().GetValue()
	case m.GetCounter() != nil:
		return m.GetCounter().GetValue()
	}
	return m.GetUntyped().GetValue()
}

// gauge prints a value, "-" where there is no series (unknown use).
func gauge(v *float64) string {
	if v == nil {
		return "-"
	}
	return strconv.FormatFloat(*v, 'f', -1, 64)
}

func bytesOf(v *float64) string {
	switch {
	case v == nil:
		return "-"
	case *v >= 1<<30:
		return strconv.FormatFloat(*v/(1<<30), 'f', -1, 64) + "Gi"
	}
	return strconv.FormatFloat(*v, 'f', -1, 64) + "B"
}

// reportPolicy waits until the policy evicted the notebook, then prints
// the policy's events in the namespace and whether the trainer still runs.
func (d *demo) reportPolicy(ctx context.Context) error {
	waitCtx, cancel := context.WithTimeout(ctx, useEvictWait)
	defer cancel()
	_, err := d.cp.WaitForEvent(waitCtx, useNamespace, "Pod", useNotebook, "IdleEvicted")
	if err != nil && ctx.Err() != nil {
		return ctx.Err()
	}
	events, listErr := d.cp.Client.CoreV1().Events(useNamespace).List(ctx, metav1.ListOptions{})
	if listErr != nil {
		return fmt.Errorf("listing the events of %s: %w", useNamespace, listErr)
	}
	if err != nil {
		d.out.printf("  after %s the policy had not evicted %s.\n", useEvictWait, useNotebook)
	}
	d.out.printf("  What the policy did (events):\n")
	for _, line := range idleEventLines(events.Items) {
		d.out.printf("    %s\n", line)
	}
	if err == nil {
		// The eviction deletes the pod, which then stops (its container
		// ends on SIGTERM): wait a little for it to be gone.
		_ = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, useGoneWait, true, func(ctx context.Context) (bool, error) {
			_, err := d.cp.Client.CoreV1().Pods(useNamespace).Get(ctx, useNotebook, metav1.GetOptions{})
			return apierrors.IsNotFound(err), nil
		})
	}
	for _, name := range []string{useNotebook, useTrainer} {
		pod, err := d.cp.Client.CoreV1().Pods(useNamespace).Get(ctx, name, metav1.GetOptions{})
		state := ""
		switch {
		case apierrors.IsNotFound(err):
			state = "gone"
		case err != nil:
			return fmt.Errorf("getting pod %s/%s: %w", useNamespace, name, err)
		case pod.DeletionTimestamp != nil:
			state = "terminating (" + podState(ctx, d.cp, pod) + ")"
		default:
			state = podState(ctx, d.cp, pod)
		}
		d.out.printf("  pod %s/%s: %s\n", useNamespace, name, state)
	}
	return nil
}

// idleEventLines are the idle policy's events (reasons Idle*), oldest
// first, one line each.
func idleEventLines(events []v1.Event) []string {
	var idle []v1.Event
	for _, e := range events {
		if strings.HasPrefix(e.Reason, "Idle") {
			idle = append(idle, e)
		}
	}
	sort.SliceStable(idle, func(i, j int) bool { return eventTime(idle[i]).Before(eventTime(idle[j])) })
	if len(idle) == 0 {
		return []string{"none"}
	}
	var lines []string
	for _, e := range idle {
		lines = append(lines, fmt.Sprintf("%s %s %s/%s: %s", e.Type, e.Reason, e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Message))
	}
	return lines
}

func eventTime(e v1.Event) time.Time {
	switch {
	case !e.EventTime.IsZero():
		return e.EventTime.Time
	case !e.LastTimestamp.IsZero():
		return e.LastTimestamp.Time
	}
	return e.CreationTimestamp.Time
}

// endUse ends the trainer's process on the simulated GPU and deletes the
// scenario's pods, which frees the replicas. It runs whatever failed, so
// its errors are said, not returned; after Ctrl-C the pods are left to
// the demo's stop, which ends the node.
func (d *demo) endUse(ctx context.Context) {
	if d.usePID != 0 {
		if err := d.real.Machine().EndProcess(d.usePID); err != nil {
			d.out.printf("  ending the trainer's process on the simulated GPU: %v\n", err)
		}
		d.usePID = 0
	}
	if ctx.Err() != nil {
		return
	}
	if err := d.deletePodsIn(ctx, []string{useNamespace}); err != nil {
		d.out.printf("  deleting the pods of %s: %v\n", useNamespace, err)
	}
}
