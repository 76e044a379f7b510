package main

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

const trainerContainer = "3f1c0b9a7e5d4c2b1a09f8e7d6c5b4a3928170f6e5d4c3b2a190817263544536"

func TestRunningContainerID(t *testing.T) {
	running := v1.Pod{Status: v1.PodStatus{Phase: v1.PodRunning, ContainerStatuses: []v1.ContainerStatus{{
		ContainerID: "containerd://" + trainerContainer, State: v1.ContainerState{Running: &v1.ContainerStateRunning{}},
	}}}}
	if got := runningContainerID(&running); got != trainerContainer {
		t.Errorf("runningContainerID = %q, want %q", got, trainerContainer)
	}
	pending := v1.Pod{Status: v1.PodStatus{Phase: v1.PodPending}}
	if got := runningContainerID(&pending); got != "" {
		t.Errorf("a pending pod's container ID %q, want none", got)
	}
	if got := runningContainerID(nil); got != "" {
		t.Errorf("no pod: container ID %q, want none", got)
	}
}

// pluginMetrics is a scrape of the plugin with a busy trainer and an idle
// notebook on one time-sliced GPU, and a claim of another namespace.
const pluginMetrics = `# HELP gpuaas_claim_gpu_utilization_percent SM utilization.
# TYPE gpuaas_claim_gpu_utilization_percent gauge
gpuaas_claim_gpu_utilization_percent{claim="notebook-gpu-abcde",device="gpu-4-ts-0",namespace="ml-notebooks",pod="notebook",profile="shared-4way"} 0
gpuaas_claim_gpu_utilization_percent{claim="trainer-gpu-fghij",device="gpu-4-ts-1",namespace="ml-notebooks",pod="trainer",profile="shared-4way"} 70
gpuaas_claim_gpu_utilization_percent{claim="other",device="gpu-0",namespace="team-a",pod="x",profile="h100"} 12
# TYPE gpuaas_claim_gpu_utilization_per_unit gauge
gpuaas_claim_gpu_utilization_per_unit{claim="notebook-gpu-abcde",device="gpu-4-ts-0",namespace="ml-notebooks",pod="notebook",profile="shared-4way"} 0
gpuaas_claim_gpu_utilization_per_unit{claim="trainer-gpu-fghij",device="gpu-4-ts-1",namespace="ml-notebooks",pod="trainer",profile="shared-4way"} 280
# TYPE gpuaas_claim_gpu_memory_used_bytes gauge
gpuaas_claim_gpu_memory_used_bytes{claim="notebook-gpu-abcde",device="gpu-4-ts-0",namespace="ml-notebooks",pod="notebook",profile="shared-4way"} 0
gpuaas_claim_gpu_memory_used_bytes{claim="trainer-gpu-fghij",device="gpu-4-ts-1",namespace="ml-notebooks",pod="trainer",profile="shared-4way"} 2.147483648e+09
# TYPE gpuaas_claim_idle_seconds_total counter
gpuaas_claim_idle_seconds_total{claim="notebook-gpu-abcde",device="gpu-4-ts-0",namespace="ml-notebooks",pod="notebook",profile="shared-4way"} 60
gpuaas_claim_idle_seconds_total{claim="trainer-gpu-fghij",device="gpu-4-ts-1",namespace="ml-notebooks",pod="trainer",profile="shared-4way"} 0
# TYPE gpuaas_claim_gpu_use_known gauge
gpuaas_claim_gpu_use_known{claim="notebook-gpu-abcde",device="gpu-4-ts-0",namespace="ml-notebooks",pod="notebook",profile="shared-4way"} 1
gpuaas_claim_gpu_use_known{claim="trainer-gpu-fghij",device="gpu-4-ts-1",namespace="ml-notebooks",pod="trainer",profile="shared-4way"} 1
# TYPE gpuaas_dra_plugin_prepared_claims gauge
gpuaas_dra_plugin_prepared_claims 3
`

func TestClaimUseLines(t *testing.T) {
	families, err := parseMetrics(strings.NewReader(pluginMetrics))
	if err != nil {
		t.Fatal(err)
	}
	got := claimUseLines(families, "ml-notebooks")
	want := []string{
		"notebook claim notebook-gpu-abcde, gpu-4-ts-0 (shared-4way): SM 0% of the GPU, 0 per GPU unit, memory 0B, idle 60s, use known 1",
		"trainer  claim trainer-gpu-fghij, gpu-4-ts-1 (shared-4way): SM 70% of the GPU, 280 per GPU unit, memory 2Gi, idle 0s, use known 1",
	}
	if !slices.Equal(got, want) {
		t.Errorf("claimUseLines:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestClaimUseLinesUnknownUse(t *testing.T) {
	// While the use is unknown the plugin has no utilization or memory
	// series: the line says "-", never 0.
	families, err := parseMetrics(strings.NewReader(`# TYPE gpuaas_claim_gpu_use_known gauge
gpuaas_claim_gpu_use_known{claim="c",device="gpu-4-ts-0",namespace="ml-notebooks",pod="notebook",profile="shared-4way"} 0
`))
	if err != nil {
		t.Fatal(err)
	}
	got := claimUseLines(families, "ml-notebooks")
	want := []string{"notebook claim c, gpu-4-ts-0 (shared-4way): SM -% of the GPU, - per GPU unit, memory -, idle -s, use known 0"}
	if !slices.Equal(got, want) {
		t.Errorf("claimUseLines = %q, want %q", got, want)
	}
	if got := claimUseLines(families, "elsewhere"); len(got) != 1 || !strings.Contains(got[0], "no per-claim series") {
		t.Errorf("a namespace with no series: %q", got)
	}
}

func TestIdleEventLines(t *testing.T) {
	at := func(s int) metav1.MicroTime { return metav1.NewMicroTime(time.Unix(1_800_000_000+int64(s), 0)) }
	event := func(reason, kind, name, msg string, s int) v1.Event {
		return v1.Event{Type: v1.EventTypeWarning, Reason: reason, Message: msg, EventTime: at(s),
			InvolvedObject: v1.ObjectReference{Kind: kind, Name: name}}
	}
	got := idleEventLines([]v1.Event{
		event("IdleEvicted", "Pod", "notebook", "pod evicted", 90),
		event("Scheduled", "Pod", "trainer", "assigned", 1),
		event("IdleWarning", "ResourceClaim", "notebook-gpu", "idle since", 60),
	})
	want := []string{
		"Warning IdleWarning ResourceClaim/notebook-gpu: idle since",
		"Warning IdleEvicted Pod/notebook: pod evicted",
	}
	if !slices.Equal(got, want) {
		t.Errorf("idleEventLines = %q, want %q", got, want)
	}
	if got := idleEventLines(nil); !slices.Equal(got, []string{"none"}) {
		t.Errorf("no events: %q", got)
	}
}

// TestUseSpecs checks demo/usage against what the scenario assumes of it:
// its names, a policy of 5% for 1m with Evict, and a claim template whose
// class the built-in catalog renders (the scenario adds that profile where
// the cluster lacks it).
func TestUseSpecs(t *testing.T) {
	root := filepath.Join("..", "..")
	objs, err := framework.ReadObjects(filepath.Join(root, "demo", "usage", useFile))
	if err != nil {
		t.Fatal(err)
	}
	var pods []string
	var quota *unstructured.Unstructured
	for _, o := range objs {
		switch o.GetKind() {
		case "Pod":
			if o.GetNamespace() != useNamespace {
				t.Errorf("pod %s/%s, want namespace %s", o.GetNamespace(), o.GetName(), useNamespace)
			}
			pods = append(pods, o.GetName())
		case "TenantQuota":
			quota = o
		}
	}
	if want := []string{useNotebook, useTrainer}; !slices.Equal(pods, want) {
		t.Errorf("pods %v, want %v", pods, want)
	}
	if quota == nil || quota.GetName() != useTenant {
		t.Fatalf("TenantQuota %v, want %s", quota, useTenant)
	}
	namespaces, _, _ := unstructured.NestedStringSlice(quota.Object, "spec", "namespaces")
	if !slices.Equal(namespaces, []string{useNamespace}) {
		t.Errorf("TenantQuota namespaces %v, want [%s]", namespaces, useNamespace)
	}
	policy, _, _ := unstructured.NestedMap(quota.Object, "spec", "idlePolicy")
	if fmt.Sprint(policy["thresholdPercent"]) != "5" || policy["duration"] != "1m" || policy["action"] != "Evict" || policy["warning"] != nil {
		t.Errorf("idlePolicy %v, want 5%% for 1m, Evict, no warning period", policy)
	}
	catalog, err := framework.ReadObjects(filepath.Join(root, "demo", "specs", "quota", "00-profiles.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range profilesFor(claimClasses(objs), catalog) {
		got = append(got, p.GetName())
	}
	if want := []string{"shared-4way"}; !slices.Equal(got, want) {
		t.Errorf("profiles for the use scenario's claims %v, want %v", got, want)
	}
}
