package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

func TestParseScenarios(t *testing.T) {
	for _, tc := range []struct {
		flag    string
		builtin bool
		want    scenarios
	}{
		// The built-in specs are made for the built-in scenarios: all run,
		// and the shapes and queueing scenarios may delete the specs' pods
		// (the demo's own) to free GPUs.
		{"", true, scenarios{health: true, shapes: true, queueing: true, use: true, freeSpecPods: true}},
		// One's own specs: nothing more than the specs runs unless asked.
		{"", false, scenarios{}},
		{"none", true, scenarios{}},
		{"health", false, scenarios{health: true}},
		// Asked for with one's own specs, queueing never deletes their pods.
		{"health,queueing", false, scenarios{health: true, queueing: true}},
		{"queueing", true, scenarios{queueing: true, freeSpecPods: true}},
		{"all", false, scenarios{health: true, shapes: true, queueing: true, use: true}},
		{"shapes", false, scenarios{shapes: true}},
		{"use", true, scenarios{use: true, freeSpecPods: true}},
		{"queueing,use", false, scenarios{queueing: true, use: true}},
	} {
		got, err := parseScenarios(tc.flag, tc.builtin)
		if err != nil || got != tc.want {
			t.Errorf("parseScenarios(%q, builtin %v) = %+v, %v; want %+v", tc.flag, tc.builtin, got, err, tc.want)
		}
	}
	for _, bad := range []string{"kueue", "health,", "none,health"} {
		if _, err := parseScenarios(bad, true); err == nil || strings.Contains(err.Error(), "\n") {
			t.Errorf("parseScenarios(%q): %v, want a one-line error", bad, err)
		}
	}
}

func TestBuiltinSpecs(t *testing.T) {
	root := t.TempDir()
	builtin := filepath.Join(root, "demo", "specs")
	if !isBuiltinSpecs("", root) || !isBuiltinSpecs(builtin+"/", root) || !isBuiltinSpecs(filepath.Join(builtin, "..", "specs"), root) {
		t.Error("the default specs and demo/specs are the built-in specs")
	}
	if isBuiltinSpecs("/tmp/myspecs", root) || isBuiltinSpecs(filepath.Join(builtin, "whole-gpu"), root) {
		t.Error("a directory of one's own is not the built-in specs")
	}
}

func TestKeepAfter(t *testing.T) {
	failed := errors.New("waiting for the dra-controller's ConfigMap: context deadline exceeded")
	for _, tc := range []struct {
		keep bool
		err  error
		want bool
	}{
		{true, nil, true},
		// After a failure the cluster is what one wants to look at.
		{true, failed, true},
		// Ctrl-C is the request to stop.
		{true, context.Canceled, false},
		{true, errors.Join(failed, context.Canceled), false},
		{false, nil, false},
		{false, failed, false},
	} {
		if got := keepAfter(tc.keep, tc.err); got != tc.want {
			t.Errorf("keepAfter(%v, %v) = %v, want %v", tc.keep, tc.err, got, tc.want)
		}
	}
}

func objects(t *testing.T, docs ...string) []*unstructured.Unstructured {
	t.Helper()
	var out []*unstructured.Unstructured
	for _, doc := range docs {
		o := &unstructured.Unstructured{}
		if err := yaml.Unmarshal([]byte(doc), &o.Object); err != nil {
			t.Fatal(err)
		}
		out = append(out, o)
	}
	return out
}

const (
	deployment4 = `{apiVersion: apps/v1, kind: Deployment, metadata: {namespace: team, name: web},
  spec: {replicas: 4, selector: {matchLabels: {app: web}}, template: {metadata: {labels: {app: web}}}}}`
	barePod       = `{apiVersion: v1, kind: Pod, metadata: {namespace: team, name: solo}}`
	job           = `{apiVersion: batch/v1, kind: Job, metadata: {namespace: team, name: train}, spec: {parallelism: 3, completions: 2}}`
	statefulSet   = `{apiVersion: apps/v1, kind: StatefulSet, metadata: {namespace: team, name: db}, spec: {selector: {matchLabels: {app: db}}}}`
	suspendedJob  = `{apiVersion: batch/v1, kind: Job, metadata: {namespace: team, name: later}, spec: {suspend: true}}`
	claimTemplate = `{apiVersion: resource.k8s.io/v1, kind: ResourceClaimTemplate, metadata: {namespace: team, name: one-gpu}}`
)

func TestWorkloadsCountDesiredPods(t *testing.T) {
	ws, err := workloadsOf(objects(t, claimTemplate, deployment4, barePod, job, statefulSet, suspendedJob))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, w := range ws {
		got[w.kind+" "+w.name] = w.want
	}
	// Desired pods, not the pods that exist when the report looks: a
	// Deployment's replicas, a Job's parallelism up to its completions, a
	// StatefulSet's default of one replica; a suspended Job none.
	want := map[string]int{"Deployment web": 4, "Pod solo": 1, "Job train": 2, "StatefulSet db": 1, "Job later": 0}
	if len(got) != len(want) {
		t.Errorf("workloads %v, want %v", got, want)
	}
	for k, n := range want {
		if got[k] != n {
			t.Errorf("%s wants %d pods, counted %d (all: %v)", k, n, got[k], got)
		}
	}
}

func pod(name string, labels map[string]string, owned, running bool) v1.Pod {
	p := v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: name, Labels: labels}}
	if owned {
		p.OwnerReferences = []metav1.OwnerReference{{Kind: "ReplicaSet", Name: "web-1", Controller: ptr.To(true)}}
	}
	if running {
		p.Status.Phase = v1.PodRunning
		p.Status.Conditions = []v1.PodCondition{{Type: v1.PodReady, Status: v1.ConditionTrue}}
	}
	return p
}

func TestTallyWaitsForTheControllersPods(t *testing.T) {
	ws, err := workloadsOf(objects(t, deployment4, barePod))
	if err != nil {
		t.Fatal(err)
	}
	web := map[string]string{"app": "web"}
	// The moment the old report looked: the bare pod runs, the Deployment's
	// pods are not there yet.
	early := []v1.Pod{pod("solo", nil, false, true)}
	if got := tally(ws, early); got.running != 1 || got.want != 5 || got.done() {
		t.Errorf("early: %d of %d running, done %v; want 1 of 5, not done", got.running, got.want, got.done())
	}
	later := append(early, pod("web-a", web, true, true), pod("web-b", web, true, true), pod("web-c", web, true, true),
		pod("web-d", web, true, false),
		// A pod that only looks like the Deployment's: no controller owns it.
		pod("impostor", web, false, true))
	got := tally(ws, later)
	if got.running != 4 || got.want != 5 || got.done() {
		t.Errorf("later: %d of %d running, done %v; want 4 of 5, not done", got.running, got.want, got.done())
	}
	if n := len(got.pods); n != 5 {
		t.Errorf("tally kept %d pods for the report, want 5 (solo and web's four)", n)
	}
	later[4] = pod("web-d", web, true, true)
	if got := tally(ws, later); got.running != 5 || !got.done() {
		t.Errorf("all running: %d of %d, done %v", got.running, got.want, got.done())
	}
}

func TestChartValuesHonourMachine(t *testing.T) {
	file := filepath.Join(t.TempDir(), "node-config.yaml")
	if err := os.WriteFile(file, []byte("apiVersion: gpu.gpuaas.io/v1alpha1\nkind: NodeConfig\ngpus:\n- indexes: [0, 1]\n  mig: dynamic\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := readNodeConfig(file)
	if err != nil {
		t.Fatal(err)
	}
	base := "kubeletPlugin:\n  kubeletDir: /k\n  nvmlBackend: mock:dgxh100\n  nodeConfig: {gpus: [{indexes: [4], timeSlicing: {replicas: 4}}]}\ncontroller: {replicas: 1}\n"
	out, err := withMachine(base, "mock:dgxa100", cfg)
	if err != nil {
		t.Fatal(err)
	}
	var values struct {
		KubeletPlugin struct {
			KubeletDir  string         `json:"kubeletDir"`
			NVMLBackend string         `json:"nvmlBackend"`
			NodeConfig  map[string]any `json:"nodeConfig"`
		} `json:"kubeletPlugin"`
		Controller map[string]any `json:"controller"`
	}
	if err := yaml.Unmarshal([]byte(out), &values); err != nil {
		t.Fatal(err)
	}
	kp := values.KubeletPlugin
	if kp.NVMLBackend != "mock:dgxa100" || kp.KubeletDir != "/k" || values.Controller["replicas"] == nil {
		t.Errorf("values %s: want nvmlBackend mock:dgxa100 and the rest kept", out)
	}
	// The dashboard step waits for the catalog's HardwareProfiles in the
	// tenant's namespace: without this, make demo failed there.
	if values.Controller["hardwareProfilesPerTenant"] != true {
		t.Errorf("values %s: want controller.hardwareProfilesPerTenant true, as the simulated node's controller runs", out)
	}
	gpus, _ := kp.NodeConfig["gpus"].([]any)
	if len(gpus) != 1 || !strings.Contains(out, "dynamic") || strings.Contains(out, "timeSlicing") || kp.NodeConfig["kind"] != nil {
		t.Errorf("nodeConfig %v: want the file's (without apiVersion and kind)", kp.NodeConfig)
	}
}

// TestChartValuesHonourMachineOnTheLibrary: on the simulated NVML library
// (the framework's values say nvmlBackend real), --nvml picks the
// library's machine; the backend stays real.
func TestChartValuesHonourMachineOnTheLibrary(t *testing.T) {
	base := "kubeletPlugin:\n  nvmlBackend: real\nextraEnv:\n- {name: GPUAAS_MOCK_NVML_MACHINE, value: dgxh100}\n- {name: GPUAAS_MOCK_NVML_STATE_DIR, value: /s}\n"
	out, err := withMachine(base, "mock:dgxb200", nil)
	if err != nil {
		t.Fatal(err)
	}
	var values struct {
		KubeletPlugin struct {
			NVMLBackend string `json:"nvmlBackend"`
		} `json:"kubeletPlugin"`
		ExtraEnv []map[string]string `json:"extraEnv"`
	}
	if err := yaml.Unmarshal([]byte(out), &values); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{}
	for _, e := range values.ExtraEnv {
		env[e["name"]] = e["value"]
	}
	if values.KubeletPlugin.NVMLBackend != "real" || env["GPUAAS_MOCK_NVML_MACHINE"] != "dgxb200" || env["GPUAAS_MOCK_NVML_STATE_DIR"] != "/s" {
		t.Errorf("values %s: want nvmlBackend real, the library's machine dgxb200, the state dir kept", out)
	}
	if _, err := withMachine("kubeletPlugin: {nvmlBackend: real}\n", "mock:dgxb200", nil); err == nil {
		t.Error("values on the library without its machine variable were accepted")
	}
}

func TestReadNodeConfigRefusesBadFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "node-config.yaml")
	if err := os.WriteFile(file, []byte("kind: NodeConfig\napiVersion: gpu.gpuaas.io/v1alpha1\ngpus:\n- indexes: [0]\n  mig: sometimes\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := readNodeConfig(file); err == nil {
		t.Error("a node configuration the plugin would refuse was accepted")
	}
}

func TestCheckNVML(t *testing.T) {
	for _, ok := range []string{"mock:dgxh100", "mock:dgxa100", "mock:dgxb200"} {
		if err := checkNVML(ok); err != nil {
			t.Errorf("checkNVML(%q): %v", ok, err)
		}
	}
	// The demo's nodes simulate their GPUs: "real" and unknown machines are
	// refused at once, in one line, instead of after the cluster started.
	for _, bad := range []string{"real", "mock:dgx1", "dgxh100"} {
		if err := checkNVML(bad); err == nil || strings.Contains(err.Error(), "\n") {
			t.Errorf("checkNVML(%q) = %v, want a one-line error", bad, err)
		}
	}
}

func TestQueueingProfiles(t *testing.T) {
	root := filepath.Join("..", "..")
	var jobs []*unstructured.Unstructured
	for _, f := range []string{"10-jobs.yaml", "20-urgent.yaml"} {
		objs, err := framework.ReadObjects(filepath.Join(root, "demo", "queueing", f))
		if err != nil {
			t.Fatal(err)
		}
		jobs = append(jobs, objs...)
	}
	catalog, err := framework.ReadObjects(filepath.Join(root, "demo", "specs", "quota", "00-profiles.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	// With specs of one's own the catalog may lack what the queueing jobs
	// name; the scenario adds exactly those entries from the built-in specs.
	var got []string
	for _, p := range profilesFor(claimClasses(jobs), catalog) {
		got = append(got, p.GetName())
	}
	slices.Sort(got)
	if want := []string{"h100", "mig-1g"}; !slices.Equal(got, want) {
		t.Errorf("profiles for the queueing jobs %v, want %v", got, want)
	}
}
