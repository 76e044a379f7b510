package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev/nvmock"
	"github.com/gpuaas/gpu-dra-driver/pkg/sliceprobe"
	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
)

// apiServerCase is one API server version and gate setting, and what the
// plugin should publish there (issue 35).
type apiServerCase struct {
	name string
	// version is a kube-apiserver built by hack/build-k8s-version.sh into
	// _output/k8s/<version>; empty: the suite's own (BinDir).
	version string
	gates   string
	want    storedShape
}

// storedShape is what the stored pool offers of the demo node's GPUs.
type storedShape struct {
	// extendedResource: a DeviceClass keeps its extendedResourceName
	// (DRAExtendedResource).
	extendedResource bool

	dynamicMIG     bool // MIG partitions of GPUs 6 and 7
	shares         bool // GPU 5's memory share
	countersBeside bool // counter sets in the slices of their devices (1.34)
	// taints: a GPU with a fault is published tainted; without device
	// taints it is not published at all (checkFaultOn).
	taints bool
	// keepsRejectedCounters: not the pool but the scheduler's allocator
	// (1.34 and 1.35 with partitionable devices): it reserves a device's
	// counters before the claim's constraints and keeps them when a
	// constraint rejects the device, so a claim of several MIG devices of
	// one GPU (matchAttribute) finds the next GPU's counters used up once
	// the first GPU tried could not hold them all. Fixed upstream in 1.36.
	keepsRejectedCounters bool
	// kubeletHealth: not the pool but the kubelet: which of a pod's claims
	// it reports device health for in the container's status. The claim's
	// Healthy condition, the plugin's, is there on every version.
	kubeletHealth kubeletHealth
}

// kubeletHealth is which claims of a pod the kubelet reports device health
// for in its containers' allocatedResourcesStatus (KEP-4680, gate
// ResourceHealthStatus: alpha and off before 1.36). Read from each
// version's pkg/kubelet/cm/dra/manager.go, and run on the real node.
type kubeletHealth int

const (
	// healthEveryClaim (1.36 and later): claims by name and from templates.
	healthEveryClaim kubeletHealth = iota
	// healthNone: the gate is off, so no claim's.
	healthNone
	// healthSameName (1.34): only where the pod's reference to the claim
	// is named like the ResourceClaim itself (it compares the two), so
	// never a claim made from a template.
	healthSameName
	// healthTemplateOnly (1.35): only claims made from a template: it
	// finds the claim in pod.status.resourceClaimStatuses, which lists
	// none of the claims a pod names directly.
	healthTemplateOnly
)

func (h kubeletHealth) String() string {
	switch h {
	case healthNone:
		return "no device health: ResourceHealthStatus is off"
	case healthSameName:
		return "device health only where the pod's claim reference is named like its ResourceClaim (fixed in 1.36)"
	case healthTemplateOnly:
		return "device health only for claims made from a template (fixed in 1.36)"
	}
	return "device health for every claim"
}

// docGates marks a case whose gates are the ones docs/install.md tells
// that version's admins to enable (its gate table's "enable" cells).
const docGates = framework.DocGates

// apiServerCases is the version matrix the suite runs on its simulated
// node: the oldest supported minor, 1.35 (where partitionable devices are
// off by default) and 1.36 (where they are beta and on), each with its
// defaults and with the documented gates, and the suite's own version.
var apiServerCases = []apiServerCase{
	{"1.34-defaults", "v1.34.4", "", storedShape{kubeletHealth: healthNone}},
	{"1.34-gates", "v1.34.4", docGates, storedShape{dynamicMIG: true, countersBeside: true, extendedResource: true, taints: true, keepsRejectedCounters: true, kubeletHealth: healthSameName}},
	{"1.35-defaults", "v1.35.4", "", storedShape{kubeletHealth: healthNone}},
	{"1.35-gates", "v1.35.4", docGates, storedShape{dynamicMIG: true, shares: true, extendedResource: true, taints: true, keepsRejectedCounters: true, kubeletHealth: healthTemplateOnly}},
	{"1.36-defaults", "v1.36.3", "", storedShape{dynamicMIG: true, shares: true, extendedResource: true, taints: true, kubeletHealth: healthEveryClaim}},
	{"1.36-gates", "v1.36.3", docGates, storedShape{dynamicMIG: true, shares: true, extendedResource: true, taints: true, kubeletHealth: healthEveryClaim}},
	{"own-defaults", "", "", storedShape{dynamicMIG: true, shares: true, extendedResource: true, taints: true}},
}

// nextVersionCases: the next minor's control plane (issue 57), built by
// hack/k8s-next-check.sh (its kubelet may not be: the version tests run
// none). They run only where E2E_K8S_VERSIONS names their version, and are
// not rows of the version matrix (docs/reference/version-matrix.md) until
// they move to apiServerCases. 1.38 has no DRA gate left to enable
// (docs/install.md), so its documented gates are its defaults.
var nextVersionCases = []apiServerCase{
	{"1.38-defaults", "v1.38.0-beta.0", "", storedShape{dynamicMIG: true, shares: true, extendedResource: true, taints: true, kubeletHealth: healthEveryClaim}},
}

// skipUnlessNamed skips a case of nextVersionCases whose version the run's
// E2E_K8S_VERSIONS does not name.
func skipUnlessNamed(t *testing.T, c apiServerCase) {
	t.Helper()
	if !slices.Contains(strings.Fields(os.Getenv("E2E_K8S_VERSIONS")), c.version) {
		t.Skipf("%s: the next minor runs only where E2E_K8S_VERSIONS names %s (hack/k8s-next-check.sh builds it)", c.name, c.version)
	}
}

// Issue 35: on each API server, the plugin publishes only what that server
// keeps, and never, at its start or at a restart, a pool in which a GPU
// could be handed out whole and in MIG parts at once (a dynamic-MIG device
// stored without the counters that keep it apart). Before the slice probe,
// 1.34 with its documented gates refused every slice (the node offered
// nothing), and 1.34 and 1.35 with default gates stored all 232 devices of
// the dynamic-MIG GPUs without a counter (shared/notes/k8s-1.34-measured.md).
func TestSlicesOnEachAPIServer(t *testing.T) {
	for _, c := range apiServerCases {
		t.Run(c.name, func(t *testing.T) { testSlicesOn(t, c) })
	}
	for _, c := range nextVersionCases {
		t.Run(c.name, func(t *testing.T) {
			skipUnlessNamed(t, c)
			testSlicesOn(t, c)
		})
	}
}

func testSlicesOn(t *testing.T, c apiServerCase) {
	opts := versionOptions(t, c, "kube-apiserver")
	opts.APIServerOnly = true
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	api := startVersionControlPlane(ctx, t, c.version, opts)
	seen := watchSlices(ctx, t, api, "versions-node")
	node, err := api.StartNode(ctx, framework.NodeOptions{Name: "versions-node", PluginBinary: pluginBinary,
		NodeConfig: filepath.Join(repoRoot, "demo", "node-config.yaml")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = node.Stop(context.Background()) })
	checkStoredShape(ctx, t, node, c.want)
	// A restart asks again before it publishes: no unsafe moment either.
	if err := node.RestartPlugin(ctx); err != nil {
		t.Fatal(err)
	}
	checkStoredShape(ctx, t, node, c.want)
	for _, bad := range seen.unsafe() {
		t.Errorf("a stored slice offered a dynamic-MIG GPU without counters: %s", bad)
	}
	checkFaultOn(ctx, t, node, c.want.taints)
	checkCatalogOn(ctx, t, api, c.want.extendedResource)
	checkGpuNodeNamesGaps(ctx, t, api, node.Name, c)
}

// wantGaps are the features the case's API server lacks, as the plugin's
// and the controller's probes name them (sliceprobe.AllGaps' order).
func wantGaps(c apiServerCase) []string {
	all := sliceprobe.AllGaps()
	var gaps []string
	switch {
	case !c.want.dynamicMIG:
		gaps = append(gaps, all[0].Feature)
	case c.want.countersBeside:
		gaps = append(gaps, all[1].Feature)
	}
	switch {
	case !c.want.taints:
		gaps = append(gaps, all[2].Feature)
	case c.version == "v1.34.4":
		gaps = append(gaps, all[3].Feature) // no effect None before 1.35
	}
	if !c.want.shares {
		gaps = append(gaps, all[4].Feature)
	}
	return gaps
}

// checkGpuNodeNamesGaps: the controller's own probe puts what the cluster
// lacks, with the gate, on the node's GpuNode (issue 35 item 2).
func checkGpuNodeNamesGaps(ctx context.Context, t *testing.T, api *framework.ControlPlane, node string, c apiServerCase) {
	t.Helper()
	want := wantGaps(c)
	var got []string
	var version string
	err := wait.PollUntilContextTimeout(ctx, time.Second, time.Minute, true, func(ctx context.Context) (bool, error) {
		gn, err := api.Dynamic.Resource(gpuNodeGVR).Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		version, _, _ = unstructured.NestedString(gn.Object, "status", "clusterVersion")
		missing, _, _ := unstructured.NestedSlice(gn.Object, "status", "missingFeatures")
		got = nil
		for _, m := range missing {
			f, _ := m.(map[string]any)
			feature, _ := f["feature"].(string)
			gate, _ := f["gate"].(string)
			if gate == "" {
				t.Errorf("GpuNode %s: missing feature %q names no gate", node, feature)
			}
			got = append(got, feature)
		}
		return version != "" && slices.Equal(got, want), nil
	})
	if err != nil {
		t.Errorf("GpuNode %s: status.missingFeatures %q (probed on %q), want %q: %v", node, got, version, want, err)
	}
}

var gpuNodeGVR = schema.GroupVersionResource{Group: "gpuaas.io", Version: "v1alpha1", Resource: "gpunodes"}

// startVersionControlPlane starts a control plane for one case, stopped
// when the test ends and removed unless it failed (its logs kept). The API
// server must say it is of the case's version: a row of the matrix run on
// another version's binaries would say nothing of its own.
func startVersionControlPlane(ctx context.Context, t *testing.T, version string, opts framework.Options) *framework.ControlPlane {
	t.Helper()
	api, err := framework.Start(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := api.Stop(); err != nil {
			t.Error(err)
		}
		if !t.Failed() {
			_ = api.Cleanup()
		}
	})
	if version != "" {
		got, err := api.Client.Discovery().ServerVersion()
		if err != nil {
			t.Fatalf("asking the API server its version: %v", err)
		}
		if got.GitVersion != version {
			t.Fatalf("the API server of case %s says it is %s", version, got.GitVersion)
		}
	}
	return api
}

// versionOptions start a control plane of the case's version and gates
// from components (skipped where not built: versionBinDir).
func versionOptions(t *testing.T, c apiServerCase, components ...string) framework.Options {
	t.Helper()
	opts := framework.Options{VersionBinDir: versionBinDir(t, c.version, components...), FeatureGates: c.gates, BinDir: cp.BinDir}
	if c.gates == docGates {
		doc := installDocGates(t, c.version)
		opts.FeatureGates, opts.RuntimeConfig = doc.FeatureGates, doc.RuntimeConfig
	}
	return opts
}

// versionBinDir is where hack/build-k8s-version.sh put the components of
// Kubernetes version ("" for the suite's own: ""). A test of a version
// that was not built is skipped, unless the run named that version in
// E2E_K8S_VERSIONS (make e2e builds the oldest; make test-versions all).
func versionBinDir(t *testing.T, version string, components ...string) string {
	t.Helper()
	if version == "" {
		return ""
	}
	dir := filepath.Join(repoRoot, "_output", "k8s", version)
	for _, name := range components {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			if framework.Required() && strings.Contains(os.Getenv("E2E_K8S_VERSIONS"), version) {
				t.Fatalf("%s %s not built (hack/build-k8s-version.sh): %v", name, version, err)
			}
			t.Skipf("%s %s not built (hack/build-k8s-version.sh)", name, version)
		}
	}
	return dir
}

// checkFaultOn gives GPU 0 a reset-required XID (48: its taint stays) and
// waits until gpu-0 is published tainted with it where the cluster keeps
// device taints, and not published at all where it does not: untainted, a
// broken GPU would be handed out.
func checkFaultOn(ctx context.Context, t *testing.T, node *framework.Node, taints bool) {
	t.Helper()
	uuid, err := gpuUUID(ctx, node, "gpu-0")
	if err != nil {
		t.Fatal(err)
	}
	if err := nvmock.InjectEvent(filepath.Join(node.PluginDataDir, "mock-nvml"), uuid, nvml.EventTypeXidCriticalError, 48,
		nvmock.WholeGPU, nvmock.WholeGPU); err != nil {
		t.Fatal(err)
	}
	var seen string
	err = wait.PollUntilContextTimeout(ctx, time.Second, time.Minute, true, func(ctx context.Context) (bool, error) {
		devices, err := node.WaitForDevices(ctx, 1)
		if err != nil {
			return false, err
		}
		i := slices.IndexFunc(devices, func(d resourceapi.Device) bool { return d.Name == "gpu-0" })
		if i < 0 {
			seen = "gpu-0 not published"
			return !taints, nil
		}
		seen = fmt.Sprintf("gpu-0 published with taints %v", devices[i].Taints)
		return taints && slices.ContainsFunc(devices[i].Taints, func(tn resourceapi.DeviceTaint) bool {
			return tn.Key == "gpu.gpuaas.io/xid" && tn.Effect == resourceapi.DeviceTaintEffectNoSchedule
		}), nil
	})
	if err != nil {
		t.Errorf("after XID 48 on GPU 0 (device taints kept: %v): %s: %v", taints, seen, err)
	}
}

// gpuUUID is the uuid attribute of a published device.
func gpuUUID(ctx context.Context, node *framework.Node, name string) (string, error) {
	devices, err := node.WaitForDevices(ctx, 1)
	if err != nil {
		return "", err
	}
	for _, d := range devices {
		if a, ok := d.Attributes["uuid"]; ok && d.Name == name && a.StringValue != nil {
			return *a.StringValue, nil
		}
	}
	return "", fmt.Errorf("no device %s with a uuid attribute", name)
}

// checkCatalogOn runs the controller on api and renders a profile with an
// extendedResourceName. Where the API server drops it, the profile says so
// (FieldsDropped, naming the gate) and its class is not rewritten at every
// resync, as it was ("Reverted DeviceClass to its profile" every 5 s).
func checkCatalogOn(ctx context.Context, t *testing.T, api *framework.ControlPlane, kept bool) {
	t.Helper()
	bin, err := framework.Build(ctx, t.TempDir(), "cmd/dra-controller")
	if err != nil {
		t.Fatal(err)
	}
	ctrl, err := api.StartController(ctx, bin) // waits until its webhook answers a claim
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("dra-controller log %s, last lines:\n%s", ctrl.LogPath, ctrl.Tail(40))
		}
		_ = ctrl.Stop()
	})
	if _, err := api.Apply(ctx, filepath.Join(repoRoot, "demo", "specs", "quota", "00-profiles.yaml"), ""); err != nil {
		t.Fatal(err)
	}
	const profile = "shared-4way" // the demo profile with an extendedResourceName
	var dropped *metav1.Condition
	err = wait.PollUntilContextTimeout(ctx, time.Second, time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := api.Dynamic.Resource(gpuProfileGVR).Get(ctx, profile, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		conds, _, _ := unstructured.NestedSlice(p.Object, "status", "conditions")
		ready := false
		dropped = nil
		for _, c := range conds {
			m, _ := c.(map[string]any)
			switch m["type"] {
			case gpuaas.ConditionReady:
				ready = m["status"] == "True"
			case gpuaas.ConditionFieldsDropped:
				dropped = &metav1.Condition{Status: metav1.ConditionStatus(fmt.Sprint(m["status"])), Message: fmt.Sprint(m["message"])}
			}
		}
		return ready, nil
	})
	if err != nil {
		t.Fatalf("profile %s not Ready: %v", profile, err)
	}
	if kept != (dropped == nil) || (dropped != nil && !strings.Contains(dropped.Message, "DRAExtendedResource")) {
		t.Errorf("extendedResourceName kept %v, but the profile's FieldsDropped condition is %+v", kept, dropped)
	}
	time.Sleep(12 * time.Second) // two resyncs of the controller (5 s)
	log, err := os.ReadFile(ctrl.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(log), "Reverted DeviceClass to its profile"); n > 0 {
		t.Errorf("the controller rewrote a DeviceClass %d times", n)
	}
}

// checkStoredShape waits for the pool to settle and compares it with want.
func checkStoredShape(ctx context.Context, t *testing.T, node *framework.Node, want storedShape) {
	t.Helper()
	devices, err := node.WaitForDevices(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	// The catalog's (checkCatalogOn), the faults' (checkFaultOn), the scheduler's and the kubelet's (elsewhere).
	got := storedShape{extendedResource: want.extendedResource, taints: want.taints,
		keepsRejectedCounters: want.keepsRejectedCounters, kubeletHealth: want.kubeletHealth}
	names := make([]string, 0, len(devices))
	for _, d := range devices {
		names = append(names, d.Name)
		got.dynamicMIG = got.dynamicMIG || strings.HasPrefix(d.Name, "gpu-6-mig-")
		got.shares = got.shares || d.Name == "gpu-5-shared"
	}
	stored, err := node.ResourceSlices(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range stored {
		got.countersBeside = got.countersBeside || len(s.Spec.SharedCounters) > 0 && len(s.Spec.Devices) > 0
	}
	if got != want {
		t.Errorf("stored pool offers %+v, want %+v; devices: %s", got, want, strings.Join(names, " "))
	}
	for _, whole := range []string{"gpu-0", "gpu-3", "gpu-4-ts-0"} {
		if !slices.Contains(names, whole) {
			t.Errorf("device %s not offered on any version: %s", whole, strings.Join(names, " "))
		}
	}
}

// sliceLog records every version of the node's slices the API server
// stored, from before the plugin's first publish.
type sliceLog struct {
	mu     sync.Mutex
	slices []resourceapi.ResourceSlice
}

func watchSlices(ctx context.Context, t *testing.T, api *framework.ControlPlane, node string) *sliceLog {
	t.Helper()
	selector := fields.OneTermEqualSelector(resourceapi.ResourceSliceSelectorNodeName, node).String()
	w, err := api.Client.ResourceV1().ResourceSlices().Watch(ctx, metav1.ListOptions{FieldSelector: selector})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	log := &sliceLog{}
	go func() {
		for ev := range w.ResultChan() {
			if s, ok := ev.Object.(*resourceapi.ResourceSlice); ok && (ev.Type == watch.Added || ev.Type == watch.Modified) {
				log.mu.Lock()
				log.slices = append(log.slices, *s)
				log.mu.Unlock()
			}
		}
	}()
	return log
}

// unsafe names each stored slice version with a dynamic-MIG device (GPU 6
// or 7, whole or a MIG partition) that consumes no counter set the slice's
// generation of the pool could define.
func (l *sliceLog) unsafe() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, s := range l.slices {
		for _, d := range s.Spec.Devices {
			dynamic := d.Name == "gpu-6" || d.Name == "gpu-7" || strings.HasPrefix(d.Name, "gpu-6-mig-") || strings.HasPrefix(d.Name, "gpu-7-mig-")
			if dynamic && len(d.ConsumesCounters) == 0 {
				out = append(out, fmt.Sprintf("%s (generation %d) device %s", s.Name, s.Spec.Pool.Generation, d.Name))
			}
		}
	}
	return out
}

// installDocGates is framework.InstallDocGates for a test.
func installDocGates(t *testing.T, version string) framework.DocSettings {
	t.Helper()
	doc, err := framework.InstallDocGates(repoRoot, version)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("from docs/install.md: --feature-gates=%s --runtime-config=%s", doc.FeatureGates, doc.RuntimeConfig)
	return doc
}
