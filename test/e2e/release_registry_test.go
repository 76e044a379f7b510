package e2e

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

// TestInstallFromRegistry (issue 40) installs a built release (make release)
// the way a user does: the release is pushed to a real OCI registry on
// 127.0.0.1 (distribution's, make release-tools) by hack/release-push.sh
// (crane push of the image index, helm push of the chart), the real node's
// containerd pulls the image from it (nothing imported), and the chart is
// installed with helm install oci://127.0.0.1:PORT/gpuaas/charts/gpuaas-dra
// --version X, its default image tag being the chart's appVersion. The
// plugin publishes, a claim's container runs, and the pod's image is the
// release's image index by digest. make e2e-release runs it.
func TestInstallFromRegistry(t *testing.T) {
	requireRealNode(t)
	dir, version := releaseUnderTest(t)
	helm := helmBin(t)
	ctx := framework.Context(t, 15*time.Minute)

	reg, err := cp.StartRegistry(ctx, filepath.Join(t.TempDir(), "registry"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = reg.Process.Stop() })
	push := exec.CommandContext(ctx, filepath.Join(repoRoot, "hack", "release-push.sh"), reg.Addr, dir, version)
	push.Env = append(os.Environ(), "KUBE_BIN_DIR="+cp.BinDir)
	out, err := push.CombinedOutput()
	if err != nil {
		t.Fatalf("hack/release-push.sh: %v\n%s", err, out)
	}
	t.Logf("pushed the release:\n%s", out)
	digest := regexp.MustCompile(`(?m)^image: \S+@(sha256:[0-9a-f]{64})$`).FindStringSubmatch(string(out))
	if digest == nil {
		t.Fatalf("hack/release-push.sh printed no image digest")
	}
	// The registry holds the index the release built, byte for byte, and
	// the chart's manifest the release wrote (helm push made a new one,
	// dated with the time of the push).
	if want := layoutDigest(t, filepath.Join(dir, "image")); want != digest[1] {
		t.Fatalf("the registry's gpu-dra-driver:%s is %s; the release's image/ has %s", version, digest[1], want)
	}
	chartDigest := regexp.MustCompile(`(?m)^chart: \S+@(sha256:[0-9a-f]{64})$`).FindStringSubmatch(string(out))
	if want := layoutDigest(t, filepath.Join(dir, "chart")); chartDigest == nil || chartDigest[1] != want {
		t.Fatalf("the registry's chart gpuaas-dra:%s is %v; the release's chart/ has %s", version, chartDigest, want)
	}

	images, err := framework.BuildTestImages(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	rn, err := cp.StartRealNode(ctx, framework.RealNodeOptions{Name: realNodeName, Images: images,
		PlainHTTPRegistries: []string{reg.Addr}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("containerd log %s:\n%s", rn.Containerd.LogPath, rn.Containerd.Tail(30))
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := rn.Stop(ctx); err != nil {
			t.Errorf("stopping the real node: %v", err)
		}
	})
	n := &realNode{RealNode: rn}

	// The tag is left to the chart: its appVersion, the release's version.
	repository := reg.Addr + "/gpuaas/gpu-dra-driver"
	values, err := rn.ChartValuesWithImage(4, repository, "", "IfNotPresent")
	if err != nil {
		t.Fatal(err)
	}
	chart := "oci://" + reg.Addr + "/gpuaas/charts/gpuaas-dra"
	begin := time.Now()
	uninstallOnCleanup(t, ctx, helm)
	if err := rn.InstallChartFrom(ctx, helm, releaseName, releaseNamespace, values, chart, "--version", version, "--plain-http"); err != nil {
		t.Fatal(err)
	}
	t.Logf("helm install %s --version %s: plugin publishing and controller ready in %.1fs", chart, version, time.Since(begin).Seconds())

	// Every pod of the release runs the pushed index, pulled by containerd.
	pods, err := cp.Client.CoreV1().Pods(releaseNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wantImage := repository + ":" + version
	for _, p := range pods.Items {
		checkReleaseImage(t, p, wantImage, digest[1])
	}
	log, err := os.ReadFile(rn.Containerd.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	var pulls []string
	for _, l := range strings.Split(string(log), "\n") {
		if strings.Contains(l, "PullImage") && strings.Contains(l, reg.Addr) {
			pulls = append(pulls, l)
		}
	}
	if len(pulls) == 0 {
		t.Errorf("containerd's log %s shows no pull from %s", rn.Containerd.LogPath, reg.Addr)
	}
	t.Logf("containerd pulled from the registry:\n%s", strings.Join(pulls, "\n"))

	// The release works: a claim's container gets its GPU.
	ns := cp.CreateNamespace(t, "from-registry")
	createOneGPUTemplate(t, ctx, ns)
	runTemplatePod(t, ctx, n, ns, "template", "one-gpu")
}

// checkReleaseImage fails unless every container of the release's pod p
// runs image (by tag), resolved to the release's image index digest.
func checkReleaseImage(t *testing.T, p v1.Pod, image, digest string) {
	t.Helper()
	for _, c := range append(p.Spec.InitContainers, p.Spec.Containers...) {
		if c.Image != image {
			t.Errorf("pod %s container %s runs %s, want %s", p.Name, c.Name, c.Image, image)
		}
	}
	for _, s := range append(p.Status.InitContainerStatuses, p.Status.ContainerStatuses...) {
		if !strings.HasSuffix(s.ImageID, "@"+digest) {
			t.Errorf("pod %s container %s: image ID %s, want the release's index %s", p.Name, s.Name, s.ImageID, digest)
		}
		t.Logf("pod %s container %s: %s (%s)", p.Name, s.Name, s.Image, s.ImageID)
	}
}

// releaseUnderTest is the built release (make release) and its version:
// $RELEASE_DIR, the version of its one chart. Without RELEASE_DIR the test
// is skipped, E2E_REQUIRED or not: the release tests have their own make
// targets (e2e-release, release-qemu), which build the release first and
// set it; make e2e does not build a release.
func releaseUnderTest(t *testing.T) (string, string) {
	t.Helper()
	dir := os.Getenv("RELEASE_DIR")
	if dir == "" {
		t.Skip("RELEASE_DIR not set: make e2e-release and make release-qemu run the release tests")
	}
	charts, _ := filepath.Glob(filepath.Join(dir, "gpuaas-dra-*.tgz"))
	_, err := os.Stat(filepath.Join(dir, "image", "index.json"))
	if len(charts) != 1 || err != nil {
		msg := "no release (one chart and image/index.json) in " + dir + ": run make release"
		if framework.Required() {
			t.Fatal(msg + " (E2E_REQUIRED=1)")
		}
		t.Skip(msg)
	}
	version := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(charts[0]), "gpuaas-dra-"), ".tgz")
	if want := os.Getenv("RELEASE_VERSION"); want != "" && want != version {
		t.Fatalf("the release in %s is %s, not RELEASE_VERSION=%s: run make release", dir, version, want)
	}
	return dir, version
}

// layoutDigest is the digest of the one manifest an OCI layout's
// index.json names: what a registry reports once the layout is pushed.
func layoutDigest(t *testing.T, layout string) string {
	t.Helper()
	var index struct {
		Manifests []struct{ Digest string } `json:"manifests"`
	}
	data, err := os.ReadFile(filepath.Join(layout, "index.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &index); err != nil || len(index.Manifests) != 1 {
		t.Fatalf("%s/index.json: %s (%v), want one manifest", layout, data, err)
	}
	return index.Manifests[0].Digest
}
