package e2e

// The upgrade a user makes from one release to the next, with claims in
// flight, and the rollback (issue 40): both releases come from a real OCI
// registry, as TestInstallFromRegistry's does.

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

// restoredLog is what the plugin logs once at start about the records it
// found: how many claims it restored and how many records it could not
// read (damaged, or of a newer format).
var restoredLog = regexp.MustCompile(`"Restored prepared claims".* claims=(\d+) .*damaged=(\d+)`)

// shapesCRD is a CRD the release under test has and the previous one has
// not.
const shapesCRD = "gpushapes.gpuaas.io"

// pushedRelease is a release in the test's registry.
type pushedRelease struct {
	version, digest string
}

// upgrade is the test's node, registry and releases.
type upgrade struct {
	*nodeEvents
	helm, chart, repository, values string
	previous, current               pushedRelease
}

// TestUpgradeFromPreviousRelease installs the previous release
// (hack/release/previous, built by hack/release-previous.sh) from a local
// registry, runs pods of every kind, upgrades to the release under test
// with helm upgrade, and rolls back with helm rollback. Through both, the
// running pods keep their containers, devices and CDI specs; the plugin
// that starts reads every record the other wrote (none damaged or refused)
// and prepares no claim again; claims prepared by one release are
// unprepared by the other with nothing left (record, CDI spec, MIG device);
// new claims of every kind work. make e2e-upgrade runs it.
func TestUpgradeFromPreviousRelease(t *testing.T) {
	requireRealNode(t)
	dir, version := releaseUnderTest(t)
	prevDir, prevVersion := previousRelease(t)
	ctx := framework.Context(t, 30*time.Minute)

	reg, err := cp.StartRegistry(ctx, filepath.Join(t.TempDir(), "registry"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = reg.Process.Stop() })
	u := &upgrade{helm: helmBin(t), chart: "oci://" + reg.Addr + "/gpuaas/charts/gpuaas-dra",
		repository: reg.Addr + "/gpuaas/gpu-dra-driver",
		previous:   pushRelease(t, ctx, reg.Addr, prevDir, prevVersion),
		current:    pushRelease(t, ctx, reg.Addr, dir, version)}

	n := startRegistryNode(t, ctx, reg.Addr)
	u.values, err = n.ChartValuesWithImage(2, u.repository, "", "IfNotPresent")
	if err != nil {
		t.Fatal(err)
	}
	n.values = u.values
	u.install(t, ctx, n)
	u.nodeEvents = &nodeEvents{n: n, h: newHealthRun(t, n), views: map[string]podView{},
		recordsDir: filepath.Join(n.KubeletDir, "plugins", framework.DriverName, "claims")}

	steps := []struct {
		name string
		run  func(*testing.T, *upgrade)
	}{
		{"Upgrade", testUpgrade},
		{"Rollback", testRollback},
		{"NothingLeftOver", func(t *testing.T, u *upgrade) { testNothingLeftOver(t, u.nodeEvents) }},
	}
	for _, s := range steps {
		if !t.Run(s.name, func(t *testing.T) { s.run(t, u) }) {
			t.Fatalf("%s failed; later steps build on it", s.name)
		}
	}
}

// previousRelease is the previous release's directory and version:
// $PREVIOUS_RELEASE_DIR, skipped without it as releaseUnderTest is.
func previousRelease(t *testing.T) (string, string) {
	t.Helper()
	dir, version := os.Getenv("PREVIOUS_RELEASE_DIR"), os.Getenv("PREVIOUS_RELEASE_VERSION")
	if dir == "" || version == "" {
		t.Skip("PREVIOUS_RELEASE_DIR or PREVIOUS_RELEASE_VERSION not set: make e2e-upgrade runs the upgrade test")
	}
	if _, err := os.Stat(filepath.Join(dir, "gpuaas-dra-"+version+".tgz")); err != nil {
		t.Fatalf("no previous release %s in %s (hack/release-previous.sh builds it): %v", version, dir, err)
	}
	return dir, version
}

// startRegistryNode starts the real node with the test images only: the
// driver's image is pulled from the registry.
func startRegistryNode(t *testing.T, ctx context.Context, registry string) *realNode {
	t.Helper()
	images, err := framework.BuildTestImages(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	rn, err := cp.StartRealNode(ctx, framework.RealNodeOptions{Name: realNodeName, Images: images,
		PlainHTTPRegistries: []string{registry}})
	if err != nil {
		t.Fatal(err)
	}
	stopAtCleanup(t, ctx, rn)
	return &realNode{RealNode: rn}
}

// pushRelease pushes a built release to the registry (hack/release-push.sh)
// and returns its version and image index digest.
func pushRelease(t *testing.T, ctx context.Context, registry, dir, version string) pushedRelease {
	t.Helper()
	push := exec.CommandContext(ctx, filepath.Join(repoRoot, "hack", "release-push.sh"), registry, dir, version)
	push.Env = append(os.Environ(), "KUBE_BIN_DIR="+cp.BinDir)
	out, err := push.CombinedOutput()
	if err != nil {
		t.Fatalf("hack/release-push.sh %s: %v\n%s", version, err, out)
	}
	digest := regexp.MustCompile(`(?m)^image: \S+@(sha256:[0-9a-f]{64})$`).FindStringSubmatch(string(out))
	if digest == nil {
		t.Fatalf("hack/release-push.sh %s printed no image digest:\n%s", version, out)
	}
	t.Logf("pushed release %s: %s", version, digest[1])
	return pushedRelease{version: version, digest: digest[1]}
}

// install installs the previous release from the registry.
func (u *upgrade) install(t *testing.T, ctx context.Context, n *realNode) {
	t.Helper()
	uninstallOnCleanup(t, ctx, u.helm)
	if err := n.InstallChartFrom(ctx, u.helm, releaseName, releaseNamespace, u.values, u.chart,
		"--version", u.previous.version, "--plain-http"); err != nil {
		t.Fatal(err)
	}
	if _, err := n.WaitForDevices(ctx, 8); err != nil {
		t.Fatal(err)
	}
	u.checkRunning(t, ctx, u.previous)
}

// testUpgrade runs pods of every kind on the previous release and upgrades
// to the release under test.
func testUpgrade(t *testing.T, u *upgrade) {
	ctx := framework.Context(t, 10*time.Minute)
	old := u.create(t, ctx, "previous", allKinds())
	u.keep(t, ctx, old)
	// As docs/install.md says: the new chart's CRDs first (helm upgrade
	// never applies a chart's crds/, and the controller may not create
	// one), so the new controller starts with every kind it serves.
	u.applyCRDs(t, ctx, u.current)
	u.roll(t, ctx, "helm upgrade", u.current, len(old),
		"upgrade", releaseName, u.chart, "--version", u.current.version, "--plain-http", "-f", u.valuesFile(t))
	u.checkControllerLog(t, ctx, "The GpuShape CRD is not installed")
	// Claims of every kind work on the new release; they stay running
	// through the rollback.
	u.keep(t, ctx, u.create(t, ctx, "current", allKinds()))
	// The new plugin unprepares what the old one prepared.
	u.deleteAndCheck(t, ctx, old, "prepared by "+u.previous.version+", unprepared by "+u.current.version)
}

// testRollback rolls back to the previous release with the pods that the
// release under test prepared still running. The record format is the
// same in both (checkpoint "v1"), so the previous plugin must read every
// record and unprepare those claims.
func testRollback(t *testing.T, u *upgrade) {
	ctx := framework.Context(t, 10*time.Minute)
	kept := slices.Sorted(func(yield func(string) bool) {
		for name := range u.views {
			if !yield(name) {
				return
			}
		}
	})
	u.roll(t, ctx, "helm rollback", u.previous, len(kept), "rollback", releaseName, "1")
	after := u.create(t, ctx, "rolled-back", allKinds())
	u.waitRunning(t, ctx, after, nil, "")
	u.deleteAndCheck(t, ctx, kept, "prepared by "+u.current.version+", unprepared by "+u.previous.version)
	for _, name := range after {
		u.views[name] = u.view(t, ctx, name)
	}
}

// roll runs helm (upgrade or rollback) and waits until the release's pods
// run rel's image and its plugin publishes what the old one did. The kept
// pods must be untouched, the new plugin must have restored exactly their
// claims (none damaged or refused) and prepared none of them again.
func (u *upgrade) roll(t *testing.T, ctx context.Context, what string, rel pushedRelease, claims int, args ...string) {
	t.Helper()
	slicesBefore := publishedDeviceNames(t, ctx)
	plugin := waitForPluginPod(t, ctx, "")
	begin := time.Now()
	args = append(args, "--namespace", releaseNamespace, "--wait", "--timeout", "5m")
	if out, err := cp.Helm(ctx, u.helm, args...); err != nil {
		t.Fatalf("%s: %v\n%s", what, err, out)
	}
	newPlugin := waitForPluginPod(t, ctx, plugin.UID)
	if err := cp.WaitForControllerReady(ctx, releaseNamespace); err != nil {
		t.Fatal(err)
	}
	when := "after " + what + " to " + rel.version
	// The simulated H100 is compiled into each release's plugin, and its
	// MIG geometry changed after 0.0.0-321-g52b18a6 (7 memory slices then,
	// a real H100's 8 now), so the dynamic MIG placements each publishes
	// differ; on a real GPU both read NVML's. Every other device must be
	// the same, and the kept MIG pods' devices are checked below.
	waitSlicesCurrentWhere(t, ctx, slicesBefore, when, func(name string) bool { return !strings.Contains(name, "-mig-") })
	t.Logf("%s to %s: new plugin pod %s publishing, controller ready in %.1fs", what, rel.version, newPlugin.Name, time.Since(begin).Seconds())
	u.checkRunning(t, ctx, rel)
	u.checkUntouched(t, ctx, when)
	u.checkRestored(t, ctx, newPlugin, claims, when)
}

// applyCRDs applies rel's chart's CRDs (its crds/, from the registry) as a
// user does before helm upgrade.
func (u *upgrade) applyCRDs(t *testing.T, ctx context.Context, rel pushedRelease) {
	t.Helper()
	dir := t.TempDir()
	if _, err := cp.Helm(ctx, u.helm, "pull", u.chart, "--version", rel.version, "--plain-http", "--untar", "--untardir", dir); err != nil {
		t.Fatal(err)
	}
	applied, err := cp.Apply(ctx, filepath.Join(dir, "gpuaas-dra", "crds"), "")
	if err != nil {
		t.Fatalf("applying the CRDs of %s: %v", rel.version, err)
	}
	err = wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := cp.Dynamic.Resource(crdGVR).Get(ctx, shapesCRD, metav1.GetOptions{})
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("CRD %s not there after applying the %d CRDs of %s: %v", shapesCRD, len(applied), rel.version, err)
	}
}

// checkControllerLog fails if a controller pod of the release logged
// unwanted.
func (u *upgrade) checkControllerLog(t *testing.T, ctx context.Context, unwanted string) {
	t.Helper()
	pods, err := cp.ComponentPods(ctx, releaseNamespace, "controller")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods {
		log, err := framework.ReadContainerLog(u.n.PodLogsDir, &p, p.Spec.Containers[0].Name)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(log, unwanted) {
			t.Errorf("controller pod %s logged %q", p.Name, unwanted)
		}
	}
}

// valuesFile writes the install's values for helm upgrade.
func (u *upgrade) valuesFile(t *testing.T) string {
	t.Helper()
	file, err := u.n.WriteValues("values-upgrade.yaml", u.values)
	if err != nil {
		t.Fatal(err)
	}
	return file
}

// checkRunning checks that the chart's pods (controller and plugin) run
// rel's image, resolved to its index digest. The MPS control daemons are
// left out: each outlives the plugin that started it, on that plugin's
// image, until the claims of its GPU end (pkg/mps).
func (u *upgrade) checkRunning(t *testing.T, ctx context.Context, rel pushedRelease) {
	t.Helper()
	image := u.repository + ":" + rel.version
	var pods []v1.Pod
	err := wait.PollUntilContextTimeout(ctx, time.Second, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		pods = nil
		for _, component := range []string{"controller", "kubelet-plugin"} {
			list, err := cp.ComponentPods(ctx, releaseNamespace, component)
			if err != nil {
				return false, err
			}
			pods = append(pods, list...)
		}
		for _, p := range pods {
			if p.DeletionTimestamp != nil || len(p.Status.ContainerStatuses) == 0 || p.Spec.Containers[0].Image != image {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		for _, p := range pods {
			t.Logf("pod %s: image %s, phase %s, deleted %v", p.Name, p.Spec.Containers[0].Image, p.Status.Phase, p.DeletionTimestamp != nil)
		}
		t.Fatalf("the release's pods do not all run %s: %v", image, err)
	}
	for _, p := range pods {
		checkReleaseImage(t, p, image, rel.digest)
	}
	daemons, err := cp.ComponentPods(ctx, releaseNamespace, "mps-control-daemon")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range daemons {
		t.Logf("MPS control daemon pod %s (%s) runs %s", p.Name, p.UID, p.Spec.Containers[0].Image)
	}
}

// checkRestored checks the new plugin's log: at start it restored the
// records of the kept claims, none damaged (a record of a format it cannot
// read counts as damaged), and it prepared none of them again.
func (u *upgrade) checkRestored(t *testing.T, ctx context.Context, plugin *v1.Pod, claims int, when string) {
	t.Helper()
	log, err := framework.ReadContainerLog(u.n.PodLogsDir, plugin, "plugin")
	if err != nil {
		t.Fatal(err)
	}
	m := restoredLog.FindStringSubmatch(log)
	if m == nil {
		t.Fatalf("%s: the plugin logged no %q line", when, "Restored prepared claims")
	}
	restored, _ := strconv.Atoi(m[1])
	damaged, _ := strconv.Atoi(m[2])
	if restored != claims || damaged != 0 {
		t.Errorf("%s: the plugin restored %d claims with %d damaged records, want %d and none damaged: %s", when, restored, damaged, claims, m[0])
	}
	for name, v := range u.views {
		for _, line := range strings.Split(log, "\n") {
			if strings.Contains(line, preparedLog) && strings.Contains(line, string(v.claimUID)) {
				t.Errorf("%s: the plugin prepared claim %s (%s) again: %s", when, name, v.claimUID, line)
			}
		}
	}
	t.Logf("%s: %s", when, m[0])
}

// deleteAndCheck deletes kept pods and their claims and checks that the
// plugin now running unprepared each: it logged so, and the claim's
// record and CDI spec are gone; the MIG devices left are the allocated ones.
func (u *upgrade) deleteAndCheck(t *testing.T, ctx context.Context, names []string, what string) {
	t.Helper()
	uids := map[string]types.UID{}
	for _, name := range names {
		uids[name] = u.views[name].claimUID
	}
	u.deletePods(t, ctx, names)
	plugin := waitForPluginPod(t, ctx, "")
	var unprepared []string
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		log, err := framework.ReadContainerLog(u.n.PodLogsDir, plugin, "plugin")
		if err != nil {
			return false, err
		}
		unprepared = unprepared[:0]
		for name, uid := range uids {
			if unpreparedLogged(log, uid) {
				unprepared = append(unprepared, name)
			}
		}
		return len(unprepared) == len(uids), nil
	})
	if err != nil {
		t.Errorf("%s: the plugin %s logged the unprepare of %v of %v: %v", what, plugin.Name, unprepared, names, err)
	}
	for name, uid := range uids {
		for _, p := range []string{u.n.CheckpointPath(uid), u.n.CDISpecPath(uid)} {
			if _, err := os.Stat(p); !os.IsNotExist(err) {
				t.Errorf("%s: claim %s: %s is left (%v)", what, name, p, err)
			}
		}
	}
	checkMIGAllocated(t, ctx, u.nodeEvents)
	t.Logf("%s: %d claims unprepared, their records and CDI specs gone: %v", what, len(uids), sets.List(sets.KeySet(uids)))
}

// unpreparedLogged tells whether a plugin's log says it unprepared the claim.
func unpreparedLogged(log string, uid types.UID) bool {
	for _, line := range strings.Split(log, "\n") {
		if strings.Contains(line, `"Unprepared claim"`) && strings.Contains(line, string(uid)) {
			return true
		}
	}
	return false
}
