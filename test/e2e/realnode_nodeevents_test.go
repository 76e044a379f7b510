package e2e

// What the rest of a GPU node does to the plugin (issue 39), on the real
// node: the kubelet restarts, containerd restarts, the plugin's data disk
// fills up, the API server is gone for a minute, the node reboots.
// Throughout, pods of every kind (whole GPU, dynamic MIG slice, time-slice
// replica, MPS memory share) keep running, and new ones are created during
// each event.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev/nvmock"
	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

const (
	// recordsFSSize is the tmpfs under the plugin's records: room for far
	// more records than the test makes, until the test fills it.
	recordsFSSize = 1 << 20
	// apiServerOutage is how long the API server stays down.
	apiServerOutage = 60 * time.Second
	// preparedLog is what the plugin logs (-v=2) once per claim it
	// prepares (prepare.go); a repeat of the kubelet's call is answered
	// from the record without it.
	preparedLog = `"Prepared claim"`
)

// TestRealNodeNodeEvents runs pods of every kind on the real node through
// a kubelet restart, a containerd restart, a full records filesystem, an
// API server outage and a reboot; then deletes every pod and checks that
// nothing is left.
func TestRealNodeNodeEvents(t *testing.T) {
	requireRealNode(t)
	n := startRealNode(t)
	// The records' own small filesystem, mounted before the plugin's
	// container starts so that its mount of the plugin directory has it.
	recordsDir := filepath.Join(n.KubeletDir, "plugins", framework.DriverName, "claims")
	if err := framework.MountTmpfs(recordsDir, recordsFSSize); err != nil {
		t.Fatal(err)
	}
	// The node's boot ID, which the simulated reboot changes, in a file
	// of the plugin's directory instead of the machine's.
	bootID := filepath.Join(n.KubeletDir, "plugins", framework.DriverName, "boot_id")
	if err := os.WriteFile(bootID, []byte("boot-1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	installChartForTest(t, n, func(values string) string {
		return strings.Replace(values, "\nextraEnv:\n", fmt.Sprintf("\nextraEnv:\n- {name: BOOT_ID_PATH, value: %q}\n", bootID), 1)
	})
	e := &nodeEvents{n: n, h: newHealthRun(t, n), recordsDir: recordsDir, bootID: bootID, views: map[string]podView{}}
	ctx := framework.Context(t, 5*time.Minute)
	e.keep(t, ctx, e.create(t, ctx, "before", allKinds()))
	steps := []struct {
		name string
		run  func(*testing.T, *nodeEvents)
	}{
		{"KubeletRestart", testKubeletRestart},
		{"ContainerdRestart", testContainerdRestart},
		{"FullRecordsDisk", testFullRecordsDisk},
		{"APIServerOutage", testAPIServerOutage},
		{"Reboot", testReboot},
		{"NothingLeftOver", testNothingLeftOver},
	}
	for _, s := range steps {
		if !t.Run(s.name, func(t *testing.T) { s.run(t, e) }) {
			t.Fatalf("%s failed; later steps build on it", s.name)
		}
	}
}

// nodeEvents is the test's node and the pods that must outlive every
// event untouched.
type nodeEvents struct {
	n          *realNode
	h          *healthRun
	recordsDir string
	bootID     string
	// views are what each kept pod's container saw, by pod name.
	views map[string]podView
}

// podView is what a running container saw of its claim, and what the
// plugin wrote for it: a container that is restarted or re-created, or
// a claim prepared again, changes it.
type podView struct {
	containerID string
	restarts    int32
	uuids       sets.Set[string]
	nodes       sets.Set[string]
	claimUID    types.UID
	spec        string
}

func allKinds() []string {
	var kinds []string
	for _, k := range podResourcesKinds {
		kinds = append(kinds, k.kind)
	}
	return kinds
}

// create makes one pod (and its claim) of each kind, named <prefix>-<kind>,
// and returns their names; it does not wait for them.
func (e *nodeEvents) create(t *testing.T, ctx context.Context, prefix string, kinds []string) []string {
	t.Helper()
	var names []string
	for _, k := range podResourcesKinds {
		if slices.Contains(kinds, k.kind) {
			name := prefix + "-" + k.kind
			e.h.pod(t, ctx, name, k.cel)
			names = append(names, name)
		}
	}
	return names
}

// waitRunning waits until the pods run and checks what each container
// saw. With slicesBefore, it first waits until the node publishes those
// devices again (after an event that deleted them).
func (e *nodeEvents) waitRunning(t *testing.T, ctx context.Context, names, slicesBefore []string, when string) {
	t.Helper()
	var pods []*v1.Pod
	for _, name := range names {
		pods = append(pods, runningPod(t, ctx, e.h.ns, name))
	}
	if slicesBefore != nil {
		waitSlicesCurrent(t, ctx, slicesBefore, when)
	}
	for _, pod := range pods {
		checkContainerSawClaims(t, ctx, e.n, pod, "ctr")
	}
}

// keep waits until the pods run and records what they saw, to be checked
// after every event.
func (e *nodeEvents) keep(t *testing.T, ctx context.Context, names []string) {
	t.Helper()
	e.waitRunning(t, ctx, names, nil, "")
	for _, name := range names {
		e.views[name] = e.view(t, ctx, name)
	}
}

func (e *nodeEvents) view(t *testing.T, ctx context.Context, name string) podView {
	t.Helper()
	pod, err := cp.Client.CoreV1().Pods(e.h.ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pod.Status.Phase != v1.PodRunning || len(pod.Status.ContainerStatuses) != 1 {
		t.Fatalf("pod %s is %s with %d container statuses, want Running with one", name, pod.Status.Phase, len(pod.Status.ContainerStatuses))
	}
	log, err := framework.ReadContainerLog(e.n.PodLogsDir, pod, "ctr")
	if err != nil {
		t.Fatal(err)
	}
	claim, err := cp.Client.ResourceV1().ResourceClaims(e.h.ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	uuids, nodes := parseGPUInfo(log)
	return podView{containerID: pod.Status.ContainerStatuses[0].ContainerID, restarts: pod.Status.ContainerStatuses[0].RestartCount, uuids: uuids, nodes: nodes,
		claimUID: claim.UID, spec: readFile(t, e.n.CDISpecPath(claim.UID))}
}

// checkUntouched checks that every kept pod still runs the same container
// (restart count 0), which saw the same devices, and that its claim's CDI
// spec is the one written when it was prepared.
func (e *nodeEvents) checkUntouched(t *testing.T, ctx context.Context, when string) {
	t.Helper()
	for _, name := range slices.Sorted(func(yield func(string) bool) {
		for name := range e.views {
			if !yield(name) {
				return
			}
		}
	}) {
		was, now := e.views[name], e.view(t, ctx, name)
		if now.containerID != was.containerID || now.restarts != 0 {
			t.Errorf("%s: pod %s runs container %s (restarted %d times), was %s", when, name, now.containerID, now.restarts, was.containerID)
		}
		if !now.uuids.Equal(was.uuids) || !now.nodes.Equal(was.nodes) {
			t.Errorf("%s: pod %s saw %v %v, was %v %v", when, name, sets.List(now.uuids), sets.List(now.nodes), sets.List(was.uuids), sets.List(was.nodes))
		}
		if now.spec != was.spec {
			t.Errorf("%s: the CDI spec of pod %s's claim changed:\nwas %s\nnow %s", when, name, was.spec, now.spec)
		}
	}
	t.Logf("%s: %d pods run the same containers with the same devices and CDI specs", when, len(e.views))
}

// checkPreparedOnce checks in the plugin's log that every claim of the
// test's namespace was prepared at most once (once, if its pod runs), and
// that the plugin's container never restarted (its log would begin
// anew).
func (e *nodeEvents) checkPreparedOnce(t *testing.T, ctx context.Context) {
	t.Helper()
	plugin := waitForPluginPod(t, ctx, "")
	if rc := plugin.Status.ContainerStatuses[0].RestartCount; rc != 0 {
		t.Errorf("the plugin's container restarted %d times", rc)
	}
	log, err := framework.ReadContainerLog(e.n.PodLogsDir, plugin, "plugin")
	if err != nil {
		t.Fatal(err)
	}
	claims, err := cp.Client.ResourceV1().ResourceClaims(e.h.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range claims.Items {
		prepared := 0
		for _, line := range strings.Split(log, "\n") {
			if strings.Contains(line, preparedLog) && strings.Contains(line, string(c.UID)) {
				prepared++
			}
		}
		pod, err := cp.Client.CoreV1().Pods(e.h.ns).Get(ctx, c.Name, metav1.GetOptions{})
		running := err == nil && pod.Status.Phase == v1.PodRunning
		if prepared > 1 || (running && prepared != 1) {
			t.Errorf("claim %s (%s) prepared %d times (its pod running: %v)", c.Name, c.UID, prepared, running)
		}
	}
}

// deletePods deletes pods and their claims and waits until both are gone.
func (e *nodeEvents) deletePods(t *testing.T, ctx context.Context, names []string) {
	t.Helper()
	for _, name := range names {
		if err := cp.Client.CoreV1().Pods(e.h.ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
	}
	for _, name := range names {
		if err := cp.WaitForPodGone(ctx, e.h.ns, name); err != nil {
			t.Fatal(err)
		}
		if err := cp.Client.ResourceV1().ResourceClaims(e.h.ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
		delete(e.views, name)
	}
}

// testKubeletRestart stops the kubelet, creates a pod of every kind while
// it is down, and starts it again with the same directories: the running
// pods keep their containers and devices, the new ones are prepared, and
// no claim is prepared twice.
func testKubeletRestart(t *testing.T, e *nodeEvents) {
	logged, err := os.Stat(e.n.Kubelet.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	startedAt := e.restart(t, "kubelet", e.n.StopKubelet, e.n.StartKubelet)
	waitKubeletProbedController(t, framework.Context(t, 2*time.Minute), e.n, logged.Size(), startedAt, false)
}

// controllerStartupProbePeriod is the chart's periodSeconds of the
// controller's startupProbe (templates/controller.yaml).
const controllerStartupProbePeriod = 5 * time.Second

// waitKubeletProbedController waits until the kubelet, started at
// startedAt after its log had logSize bytes, has settled the controller
// pod's probes, and the API shows the pod started and ready. A starting
// kubelet may forget its probe results: until its startup probe worker
// first passes (at most one period after the kubelet starts) it reports
// the controller's container not started and not ready, and the
// fail-closed claim webhook has no endpoints. Whether it forgets depends
// on which of the kubelet's first status sync and the worker's first probe
// runs first, so the wait is for one period, then for the kubelet's last
// startup and readiness results (its "SyncLoop (probe)" lines) to be
// "started" and "ready". The step after this one stops containerd, and a
// kubelet without its runtime reports no pod status, so a controller
// caught unready then stays unready until containerd is back: a webhook
// that answers just after the kubelet's restart proves nothing.
//
// restarted says the controller's container was started again after the
// kubelet (a reboot): then the kubelet must have logged its startup probe
// passing, and the API's Ready until then is the one from before.
func waitKubeletProbedController(t *testing.T, ctx context.Context, n *realNode, logSize int64, startedAt time.Time, restarted bool) {
	t.Helper()
	controllers, err := cp.ComponentPods(ctx, releaseNamespace, "controller")
	if err != nil || len(controllers) != 1 {
		t.Fatalf("want the release's one controller pod: %d pods, %v", len(controllers), err)
	}
	name := controllers[0].Name
	probeLine := regexp.MustCompile(`"SyncLoop \(probe\)" probe="([a-z]+)" status="([a-z ]+)" pod="` + regexp.QuoteMeta(releaseNamespace+"/"+name) + `"`)
	var probes map[string]string
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		if time.Since(startedAt) < controllerStartupProbePeriod+time.Second {
			return false, nil
		}
		if probes, err = lastProbeResults(n.Kubelet.LogPath, logSize, probeLine); err != nil {
			return false, err
		}
		if s := probes["startup"]; s != "started" && (s != "" || restarted) {
			return false, nil
		}
		if r := probes["readiness"]; r != "" && r != "ready" {
			return false, nil
		}
		p, err := cp.Client.CoreV1().Pods(releaseNamespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil // the API answers again in a moment
		}
		return podReady(p) && len(p.Status.ContainerStatuses) > 0 && ptr.Deref(p.Status.ContainerStatuses[0].Started, false), nil
	})
	if err != nil {
		t.Fatalf("controller pod %s not started and ready after the kubelet's restart (its last probe results: %v): %v", name, probes, err)
	}
	waitClaimWebhookServes(t, ctx)
}

// lastProbeResults reads the kubelet's log from offset on and returns the
// last result of each of the pod's probes that line (the kubelet's
// "SyncLoop (probe)" lines of one pod; probe and status its two groups)
// matched, by probe: "startup" to "started" or "unhealthy", "readiness" to
// "ready" or "not ready".
func lastProbeResults(logPath string, offset int64, line *regexp.Regexp) (map[string]string, error) {
	log, err := os.ReadFile(logPath)
	if err != nil {
		return nil, fmt.Errorf("read the kubelet's log: %w", err)
	}
	results := map[string]string{}
	if int64(len(log)) <= offset {
		return results, nil
	}
	for _, m := range line.FindAllStringSubmatch(string(log[offset:]), -1) {
		results[m[1]] = m[2]
	}
	return results, nil
}

// testContainerdRestart is testKubeletRestart for containerd: its shims
// keep the containers running, and the CDI specs are there for the
// containers created after it.
func testContainerdRestart(t *testing.T, e *nodeEvents) {
	_ = e.restart(t, "containerd", e.n.StopContainerd, e.n.StartContainerd)
}

// restart stops a component of the node, creates a pod of every kind
// while it is down, starts it again, and checks the new pods, the kept
// ones and that no claim was prepared twice.
// It returns when the component was started again.
func (e *nodeEvents) restart(t *testing.T, component string, stop func() error, start func(context.Context) error) time.Time {
	ctx := framework.Context(t, 8*time.Minute)
	// The controller runs on this node: after the step before (a kubelet
	// restart) its pod may be out of the webhook's endpoints for a moment,
	// and the fail-closed webhook refuses claims until it is back ("no
	// endpoints available"). Wait for it, as a user would retry.
	waitClaimWebhookServes(t, ctx)
	slicesBefore := publishedDeviceNames(t, ctx)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	during := e.create(t, ctx, component+"-down", allKinds())
	gap := watchSliceGap(ctx)
	if err := start(ctx); err != nil {
		t.Fatal(err)
	}
	startedAt := time.Now()
	when := "after the " + component + " restart"
	e.waitRunning(t, ctx, during, slicesBefore, when)
	// How long the node offered nothing: logged, not asserted (a
	// starting kubelet deletes its node's slices; the plugin publishes
	// them again).
	t.Logf("%s: the node published none of its devices for %v", when, gap().Round(time.Millisecond))
	e.checkUntouched(t, ctx, when)
	e.checkPreparedOnce(t, ctx)
	e.deletePods(t, ctx, during)
	return startedAt
}

// testFullRecordsDisk fills the filesystem of the plugin's records and
// creates pods of every kind: each prepare fails with an error that says
// the disk is full and where, leaves no record, temporary file, CDI spec
// or MIG device behind, and succeeds once the space is freed.
func testFullRecordsDisk(t *testing.T, e *nodeEvents) {
	ctx := framework.Context(t, 8*time.Minute)
	filler := filepath.Join(e.recordsDir, "filler")
	size, err := framework.FillFilesystem(filler)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(filler) })
	before := entries(t, e.recordsDir)
	migBefore := mockMIGDevices(t, e.n)
	t.Logf("records filesystem %s full: %d bytes of filler, %d records", e.recordsDir, size, len(before)-1)

	names := e.create(t, ctx, "disk-full", allKinds())
	for _, name := range names {
		msg := waitPrepareFailure(t, ctx, e.h.ns, name, "no space left on device")
		claim, err := cp.Client.ResourceV1().ResourceClaims(e.h.ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{string(claim.UID), e.recordsDir} {
			if !strings.Contains(msg, want) {
				t.Errorf("pod %s: the prepare error does not name %s: %s", name, want, msg)
			}
		}
		t.Logf("pod %s: %s", name, msg)
		if _, err := os.Stat(e.n.CDISpecPath(claim.UID)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("pod %s: claim %s failed to prepare but its CDI spec %s is there (%v)", name, claim.UID, e.n.CDISpecPath(claim.UID), err)
		}
	}
	if after := entries(t, e.recordsDir); !slices.Equal(after, before) {
		t.Errorf("failed prepares left files in the records directory: %v, was %v", after, before)
	}
	if mig := mockMIGDevices(t, e.n); mig != migBefore {
		t.Errorf("failed prepares left MIG devices: %d on the GPUs, was %d", mig, migBefore)
	}
	for _, name := range names {
		pod, err := cp.Client.CoreV1().Pods(e.h.ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if pod.Status.Phase == v1.PodRunning {
			t.Errorf("pod %s runs although its claim's record could not be written", name)
		}
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	e.waitRunning(t, ctx, names, nil, "")
	e.checkUntouched(t, ctx, "after the records disk was full")
	e.checkPreparedOnce(t, ctx)
	e.deletePods(t, ctx, names)
}

// entries lists a directory's file names, sorted.
func entries(t *testing.T, dir string) []string {
	t.Helper()
	des, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, d := range des {
		names = append(names, d.Name())
	}
	return names
}

// waitPrepareFailure waits for the kubelet's event on a pod whose claim
// failed to prepare with a message containing want, and returns the
// message.
func waitPrepareFailure(t *testing.T, ctx context.Context, ns, pod, want string) string {
	t.Helper()
	var msg string
	var seen []string
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		events, err := cp.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + pod})
		if err != nil {
			return false, nil
		}
		seen = seen[:0]
		for _, ev := range events.Items {
			seen = append(seen, ev.Reason+": "+ev.Message)
			if ev.Reason == "FailedPrepareDynamicResources" && strings.Contains(ev.Message, want) {
				msg = ev.Message
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("pod %s: no FailedPrepareDynamicResources event with %q (events: %q): %v", pod, want, seen, err)
	}
	return msg
}

// testAPIServerOutage stops the API server for a minute in the middle of
// churn: pods of every kind were just created (their claims being
// allocated and prepared) and others just deleted (being unprepared).
// Afterwards the new pods run with their devices, no claim was prepared
// twice or lost, the deleted pods' claims are unprepared, the kept pods
// are untouched, the plugin's container did not restart, and the node's
// ResourceSlices are the ones published before.
func testAPIServerOutage(t *testing.T, e *nodeEvents) {
	ctx := framework.Context(t, 10*time.Minute)
	slicesBefore := publishedDeviceNames(t, ctx)
	going := e.create(t, ctx, "going", allKinds())
	e.waitRunning(t, ctx, going, nil, "")
	var goingUIDs []types.UID
	for _, name := range going {
		goingUIDs = append(goingUIDs, e.view(t, ctx, name).claimUID)
		if err := cp.Client.CoreV1().Pods(e.h.ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	coming := e.create(t, ctx, "outage", allKinds())
	witnesses, names := outageWitnesses(t, ctx), apiServerNames(t, ctx, e.h.ns)
	if err := cp.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	time.Sleep(apiServerOutage)
	if err := cp.StartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	t.Logf("API server down %v", back.Sub(stopped).Round(time.Second))
	e.waitRunning(t, ctx, coming, slicesBefore, "after the API server outage")
	for _, name := range going {
		if err := cp.WaitForPodGone(ctx, e.h.ns, name); err != nil {
			t.Fatal(err)
		}
	}
	for _, uid := range goingUIDs {
		if err := waitGone(ctx, e.n.CDISpecPath(uid)); err != nil {
			t.Errorf("claim %s of a pod deleted before the outage: CDI spec still there: %v", uid, err)
		}
	}
	e.checkUntouched(t, ctx, "after the API server outage")
	e.checkPreparedOnce(t, ctx)
	for _, w := range witnesses {
		checkOutageLog(t, e.n, w, names, stopped, back)
	}
	e.deletePods(t, ctx, append(going, coming...))
}

// outageWitness is a container whose log during the API server outage
// must say what it waits for.
type outageWitness struct {
	pod       *v1.Pod
	container string
	// mustWait: the container must log that it waits. The controller
	// does (its leader loses the lease, restarts and waits at startup);
	// the plugin has nothing to say unless the kubelet asks it to
	// prepare then.
	mustWait bool
}

// outageWitnesses are the plugin's and the controller's containers, both
// on the real node.
func outageWitnesses(t *testing.T, ctx context.Context) []outageWitness {
	t.Helper()
	plugin := waitForPluginPod(t, ctx, "")
	controllers, err := cp.ComponentPods(ctx, releaseNamespace, "controller")
	if err != nil || len(controllers) != 1 {
		t.Fatalf("want the release's one controller pod: %d pods, %v", len(controllers), err)
	}
	return []outageWitness{{plugin, "plugin", false}, {&controllers[0], "controller", true}}
}

// apiServerNames are how a line says what it waits for: the API server in
// words, or by the address it could not reach (client-go's own lines name
// the URL: the API server's, or its Service's), or the object it could not
// get: the claim (the kubelet plugin helper's "retrieve claim
// <namespace>/<name>", logged when the kubelet's prepare fails and will be
// retried) or the leader's Lease (client-go's leader election, "Error
// retrieving lease lock" with lock=<namespace>/<name>).
func apiServerNames(t *testing.T, ctx context.Context, claimNamespace string) []string {
	t.Helper()
	names := []string{"API server", "apiserver", "claim " + claimNamespace + "/", "lease lock"}
	if u, err := url.Parse(cp.Config.Host); err == nil {
		names = append(names, u.Host)
	}
	svc, err := cp.Client.CoreV1().Services("default").Get(ctx, "kubernetes", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return append(names, net.JoinHostPort(svc.Spec.ClusterIP, "443"))
}

// maxOutageLogErrors is how many unclear lines of one container the test
// quotes.
const maxOutageLogErrors = 10

// checkOutageLog checks what a container logged while the API server was
// down (issue 39: "the error messages on the way say what they wait
// for"): that every error or warning it logged then names the API server
// or the claim it could not get, and (mustWait) that it said it waits.
func checkOutageLog(t *testing.T, n *realNode, w outageWitness, names []string, from, to time.Time) {
	t.Helper()
	lines, err := framework.ContainerLogBetween(n.PodLogsDir, w.pod, w.container, from, to)
	if err != nil {
		t.Fatal(err)
	}
	// An error or warning the container logged before the outage too is
	// not the outage's: on the simulated node each MIG prepare logs that
	// the host has no nvidia-caps (CUDA could not see the MIG device), and
	// a MIG claim prepared while the API server is down logs it again.
	earlier, err := framework.ContainerLogBetween(n.PodLogsDir, w.pod, w.container, time.Time{}, from)
	if err != nil {
		t.Fatal(err)
	}
	before := sets.New[string]()
	for _, l := range earlier {
		before.Insert(klogMessage(l))
	}
	waited, unclear, known := false, 0, 0
	for _, l := range lines {
		named := slices.ContainsFunc(names, func(s string) bool { return strings.Contains(l, s) })
		waited = waited || named
		if (strings.HasPrefix(l, "E") || strings.HasPrefix(l, "W")) && !named {
			if before.Has(klogMessage(l)) {
				known++
				continue
			}
			if unclear++; unclear <= maxOutageLogErrors {
				t.Errorf("%s logged during the API server outage, without saying it waits for the API server: %s", w.container, l)
			}
		}
	}
	if w.mustWait && !waited {
		t.Errorf("%s logged nothing during the API server outage that says it waits for the API server (%d lines)", w.container, len(lines))
	}
	t.Logf("%s: %d lines logged during the API server outage (%d errors or warnings it logged before it too)", w.container, len(lines), known)
}

// klogMessage is a klog line's severity and message, without its time,
// source line and key/value pairs: two lines of one event at different
// times have the same.
func klogMessage(line string) string {
	head, rest, ok := strings.Cut(line, "] ")
	if !ok || head == "" {
		return line
	}
	if msg, err := strconv.QuotedPrefix(rest); err == nil {
		rest = msg
	}
	return head[:1] + " " + rest
}

// waitSlicesCurrent waits until the node publishes the devices it
// published before an event, and fails if it never does. The kubelet
// deletes a node's ResourceSlices when it starts; the plugin publishes
// them again.
func waitSlicesCurrent(t *testing.T, ctx context.Context, before []string, when string) {
	t.Helper()
	waitSlicesCurrentWhere(t, ctx, before, when, func(string) bool { return true })
}

// waitSlicesCurrentWhere is waitSlicesCurrent for the devices keep selects.
func waitSlicesCurrentWhere(t *testing.T, ctx context.Context, before []string, when string, keep func(string) bool) {
	t.Helper()
	before = slices.DeleteFunc(slices.Clone(before), func(name string) bool { return !keep(name) })
	published := func() []string {
		return slices.DeleteFunc(publishedDeviceNames(t, ctx), func(name string) bool { return !keep(name) })
	}
	start := time.Now()
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		return slices.Equal(published(), before), nil
	})
	if err != nil {
		t.Fatalf("%s: the node publishes %v, not the %d devices it published before: %v", when, published(), len(before), err)
	}
	t.Logf("%s: the node's %d devices published again (%v after the wait began)", when, len(before), time.Since(start).Round(time.Millisecond))
}

// watchSliceGap measures how long, from now until done is called, the
// node published none of its devices; done returns it.
func watchSliceGap(ctx context.Context) (done func() time.Duration) {
	ctx, cancel := context.WithCancel(ctx)
	out := make(chan time.Duration, 1)
	go func() {
		var gone time.Time
		var gap time.Duration
		_ = wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
			devices, err := cp.PoolDevices(ctx, realNodeName)
			switch {
			case err != nil: // the API answers again in a moment
			case len(devices) == 0 && gone.IsZero():
				gone = time.Now()
			case len(devices) > 0 && !gone.IsZero():
				gap += time.Since(gone)
				gone = time.Time{}
			}
			return false, nil
		})
		if !gone.IsZero() {
			gap += time.Since(gone)
		}
		out <- gap
	}()
	return func() time.Duration {
		cancel()
		return <-out
	}
}

// publishedDeviceNames are the node's published devices, sorted.
func publishedDeviceNames(t *testing.T, ctx context.Context) []string {
	t.Helper()
	devices, err := cp.PoolDevices(ctx, realNodeName)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, d := range devices {
		names = append(names, d.Name)
	}
	slices.Sort(names)
	return names
}

// testNothingLeftOver deletes every pod and claim and checks that the
// plugin left nothing: no record, no CDI spec, no MIG device, no GPU in
// a compute mode of its own.
func testNothingLeftOver(t *testing.T, e *nodeEvents) {
	ctx := framework.Context(t, 5*time.Minute)
	var names []string
	for name := range e.views {
		names = append(names, name)
	}
	e.deletePods(t, ctx, names)
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		specs, _ := filepath.Glob(filepath.Join(e.n.CDIRoot, "k8s."+framework.DriverName+"-claim_*"))
		gis, exclusive := mockMachineLeaks(t, e.h.stateDir)
		return len(entries(t, e.recordsDir)) == 0 && len(specs) == 0 && gis == 0 && exclusive == 0, nil
	})
	if err != nil {
		specs, _ := filepath.Glob(filepath.Join(e.n.CDIRoot, "k8s."+framework.DriverName+"-claim_*"))
		gis, exclusive := mockMachineLeaks(t, e.h.stateDir)
		t.Errorf("left after every pod and claim is gone: records %v, CDI specs %v, %d MIG devices, %d GPUs in a compute mode of their own",
			entries(t, e.recordsDir), specs, gis, exclusive)
	}
}

// testReboot reboots the node: every process of it ends at once, what
// lives under /run goes, the simulated GPUs are power-cycled (no MIG
// device, compute mode or MPS daemon survives) with a new boot ID, and
// containerd and the kubelet start again. Every kept pod comes back on the
// same devices (its GPUs' UUIDs; a MIG device is made anew, so its UUID
// may change) with a working CUDA probe and its MPS daemon, the MIG
// devices on the GPUs are exactly the allocated ones, and pods of every
// kind can be created after it.
func testReboot(t *testing.T, e *nodeEvents) {
	ctx := framework.Context(t, 10*time.Minute)
	slicesBefore := publishedDeviceNames(t, ctx)
	plugin := waitForPluginPod(t, ctx, "")
	logged, err := os.Stat(e.n.Kubelet.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.n.PowerOff(); err != nil {
		t.Fatal(err)
	}
	id, err := nvmock.Reboot(e.h.stateDir, e.bootID)
	if err != nil {
		t.Fatal(err)
	}
	if gis := mockMIGDevices(t, e.n); gis != 0 {
		t.Fatalf("%d MIG devices on the GPUs after the power cycle", gis)
	}
	t.Logf("node powered off, GPUs power-cycled, new boot %s", id)
	if err := e.n.PowerOn(ctx); err != nil {
		t.Fatal(err)
	}
	poweredOn := time.Now()
	if _, err := cp.WaitForPluginPod(ctx, releaseNamespace, ""); err != nil {
		t.Fatal(err)
	}
	var kept []string
	for name := range e.views {
		kept = append(kept, name)
	}
	slices.Sort(kept)
	// The API says Running until the kubelet reports the new containers.
	for _, name := range kept {
		was := e.views[name].containerID
		_, err := cp.WaitForPod(ctx, e.h.ns, name, "running a container started after the reboot", func(p *v1.Pod) bool {
			return p.Status.Phase == v1.PodRunning && podReady(p) && len(p.Status.ContainerStatuses) == 1 &&
				p.Status.ContainerStatuses[0].ContainerID != was && p.Status.ContainerStatuses[0].State.Running != nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	e.waitRunning(t, ctx, kept, slicesBefore, "after the reboot")
	for _, name := range kept {
		was, now := e.views[name], e.view(t, ctx, name)
		if !now.nodes.Equal(was.nodes) {
			t.Errorf("after the reboot pod %s sees %v, was %v", name, sets.List(now.nodes), sets.List(was.nodes))
		}
		if !strings.Contains(name, "mig") && !now.uuids.Equal(was.uuids) {
			t.Errorf("after the reboot pod %s sees %v, was %v", name, sets.List(now.uuids), sets.List(was.uuids))
		}
		e.views[name] = now
	}
	checkMIGAllocated(t, ctx, e)
	// The controller runs on this node too, and its fail-closed webhook
	// refuses our claims until it is ready again: wait for it, as a user
	// would retry.
	scaleController(t, ctx, 1)
	// The webhook may answer on the pod's endpoint from before the reboot
	// and then lose it while the kubelet runs the new container's startup
	// probe (seen in CI: "no endpoints available" right after it served).
	waitKubeletProbedController(t, ctx, e.n, logged.Size(), poweredOn, true)
	after := e.create(t, ctx, "after-reboot", allKinds())
	e.waitRunning(t, ctx, after, nil, "")
	checkMIGAllocated(t, ctx, e)
	t.Logf("after the reboot: %d pods back on their devices, the plugin pod %s restarted, %d new pods running", len(kept), plugin.Name, len(after))
	e.deletePods(t, ctx, after)
}

// checkMIGAllocated checks that the MIG instances on the simulated GPUs
// are exactly the MIG devices allocated to the namespace's claims in use:
// the same GPU, profile and placement each, and every instance with its
// compute instance (after a power cycle the plugin makes them again). A
// claim is in use while a pod it is reserved for exists and is not being
// deleted: after a reboot, the claim of a pod deleted before it may still
// name that pod for a moment (a run here: 3 claims reserved, 1 pod left),
// so the two sides are compared until they agree, for up to 30 s.
func checkMIGAllocated(t *testing.T, ctx context.Context, e *nodeEvents) {
	t.Helper()
	var onGPUs, allocated sets.Set[string]
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		var err error
		if allocated, err = migAllocatedInUse(ctx, e.h.ns); err != nil {
			return false, err
		}
		onGPUs = mockMIGPlacements(t, e.n)
		return onGPUs.Equal(allocated), nil
	})
	if err != nil {
		t.Errorf("MIG instances on the GPUs %v, allocated MIG devices in use %v (%v)", sets.List(onGPUs), sets.List(allocated), err)
	}
}

// migAllocatedInUse are the MIG devices (migPlacement) allocated to the
// claims of ns that a live pod uses.
func migAllocatedInUse(ctx context.Context, ns string) (sets.Set[string], error) {
	claims, err := cp.Client.ResourceV1().ResourceClaims(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	pods, err := cp.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	live := sets.New[types.UID]()
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil {
			live.Insert(p.UID)
		}
	}
	devices, err := cp.PoolDevices(ctx, realNodeName)
	if err != nil {
		return nil, err
	}
	published := deviceAttrs(devices)
	allocated := sets.New[string]()
	for _, c := range claims.Items {
		if c.Status.Allocation == nil || !slices.ContainsFunc(c.Status.ReservedFor, func(r resourceapi.ResourceClaimConsumerReference) bool {
			return live.Has(r.UID)
		}) {
			continue
		}
		for _, r := range c.Status.Allocation.Devices.Results {
			if d, ok := published[r.Device]; ok && stringAttr(d, "type") == "mig" {
				p, err := migPlacement(d)
				if err != nil {
					return nil, err
				}
				allocated.Insert(p)
			}
		}
	}
	return allocated, nil
}

// migPlacement is "<GPU UUID>/<N>g@<first memory slice>" of a published
// MIG device: its parent, its profile's compute slices, and its
// placement's start (the last part of its name, mig.DeviceName).
func migPlacement(d resourceapi.Device) (string, error) {
	profile := stringAttr(d, "profile")
	computeSlices, _, ok := strings.Cut(profile, "g.")
	start := d.Name[strings.LastIndexByte(d.Name, '-')+1:]
	if !ok || stringAttr(d, "parentUUID") == "" {
		return "", fmt.Errorf("MIG device %s has profile %q and parent %q", d.Name, profile, stringAttr(d, "parentUUID"))
	}
	return fmt.Sprintf("%s/%sg@%s", stringAttr(d, "parentUUID"), computeSlices, start), nil
}

// giProfileSlices are the compute slices of NVML's GPU instance profiles.
var giProfileSlices = map[uint32]int{
	nvml.GPU_INSTANCE_PROFILE_1_SLICE: 1, nvml.GPU_INSTANCE_PROFILE_2_SLICE: 2, nvml.GPU_INSTANCE_PROFILE_3_SLICE: 3,
	nvml.GPU_INSTANCE_PROFILE_4_SLICE: 4, nvml.GPU_INSTANCE_PROFILE_7_SLICE: 7, nvml.GPU_INSTANCE_PROFILE_8_SLICE: 8,
	nvml.GPU_INSTANCE_PROFILE_6_SLICE: 6, nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1: 1, nvml.GPU_INSTANCE_PROFILE_2_SLICE_REV1: 2,
	nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2: 1,
}

// mockMIGPlacements are the GPU instances on the node's simulated GPUs, as
// migPlacement writes them; an instance without a compute instance (half
// made) is marked so.
func mockMIGPlacements(t *testing.T, n *realNode) sets.Set[string] {
	t.Helper()
	var state struct {
		GPUs []struct {
			UUID         string `json:"uuid"`
			GPUInstances []struct {
				ProfileID uint32            `json:"profileID"`
				Start     uint32            `json:"start"`
				CIs       []json.RawMessage `json:"computeInstances"`
			} `json:"gpuInstances"`
		} `json:"gpus"`
	}
	readMockMachineState(t, filepath.Join(n.KubeletDir, "plugins", framework.DriverName, "mock-nvml"), &state)
	out := sets.New[string]()
	for _, g := range state.GPUs {
		for _, gi := range g.GPUInstances {
			p := fmt.Sprintf("%s/%dg@%d", g.UUID, giProfileSlices[gi.ProfileID], gi.Start)
			if len(gi.CIs) == 0 {
				p += " (no compute instance)"
			}
			out.Insert(p)
		}
	}
	return out
}
