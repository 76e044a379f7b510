package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

// TestArm64PluginUnderQemu (issue 40) runs the release's arm64 binaries,
// the very files of its linux/arm64 image (make release keeps them in
// _output/release/bin/arm64), on this amd64 machine under qemu-user
// (Debian's qemu-user-static, no binfmt: qemu-aarch64-static -L with the
// arm64 image base as the root, so glibc and the loader are the image's):
// --version and --help of both, then the kubelet plugin on a simulated
// node (the kubelet simulator, a mock 8 x H100 NVML) until it has
// registered and published its devices to the suite's real API server,
// and has prepared and unprepared one claim.
// make release-qemu runs it. What it cannot show: NVML on a real arm64
// driver, and the kernel's side (a real arm64 kubelet, containerd, runc).
func TestArm64PluginUnderQemu(t *testing.T) {
	dir, _ := releaseUnderTest(t)
	qemu, err := exec.LookPath("qemu-aarch64-static")
	if err != nil {
		if framework.Required() {
			t.Fatalf("qemu-aarch64-static not found (E2E_REQUIRED=1): hack/build-cross.sh installs it")
		}
		t.Skip("qemu-aarch64-static not found: hack/build-cross.sh installs it")
	}
	rootfs := filepath.Join(dir, "image-base-arm64", "rootfs")
	bin := filepath.Join(dir, "bin", "arm64")
	under := []string{qemu, "-L", rootfs}
	for _, cmd := range []string{"dra-kubelet-plugin", "dra-controller"} {
		for _, arg := range []string{"--version", "--help"} {
			out, err := exec.Command(qemu, "-L", rootfs, filepath.Join(bin, cmd), arg).CombinedOutput()
			// --help exits 0 with pflag's usage on stderr; the
			// output is what matters.
			if err != nil && arg == "--version" {
				t.Fatalf("%s %s under qemu: %v\n%s", cmd, arg, err, out)
			}
			text := string(out)
			if arg == "--version" {
				if !strings.HasPrefix(text, cmd+" ") || !strings.Contains(text, "linux/arm64") {
					t.Errorf("%s --version under qemu printed %q, want %s <version> (... linux/arm64)", cmd, text, cmd)
				}
				t.Logf("qemu-aarch64-static %s --version: %s", cmd, strings.TrimSpace(text))
				continue
			}
			if !strings.Contains(text, "--version") || !strings.Contains(text, "--kubeconfig") {
				t.Errorf("%s --help under qemu printed no flags:\n%s", cmd, text)
			}
			t.Logf("qemu-aarch64-static %s --help: %d lines, first: %s", cmd, strings.Count(text, "\n"), strings.SplitN(text, "\n", 2)[0])
		}
	}

	// The plugin under qemu on a simulated node: slower than native, so
	// more time than startNode gives.
	ctx := framework.Context(t, 8*time.Minute)
	begin := time.Now()
	node, err := cp.StartNode(ctx, framework.NodeOptions{
		Name: nodeName(t), PluginBinary: filepath.Join(bin, "dra-kubelet-plugin"), RunUnder: under,
		NodeConfig: filepath.Join(repoRoot, "demo", "node-config.yaml"),
	})
	if err != nil {
		t.Fatalf("the arm64 plugin under qemu: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := node.Stop(ctx); err != nil {
			t.Errorf("stopping node: %v", err)
		}
	})
	devices, err := cp.PoolDevices(ctx, node.Name)
	if err != nil {
		t.Fatal(err)
	}
	if len(devices) == 0 {
		t.Fatal("the arm64 plugin published no devices")
	}
	t.Logf("the arm64 plugin under qemu registered and published %d devices in %.1fs", len(devices), time.Since(begin).Seconds())

	// It prepares and unprepares a claim, as on an arm64 node: the claim's
	// CDI spec and checkpoint record are written, then removed.
	ns := cp.CreateNamespace(t, "arm64")
	createGPUPod(t, ctx, ns, "arm64", 1, nil)
	pod := runningPod(t, ctx, ns, "arm64")
	claim := onlyClaim(t, ctx, pod)
	checkPrepared(t, node, pod, claim)
	if err := cp.Client.CoreV1().Pods(ns).Delete(ctx, "arm64", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := cp.WaitForPodGone(ctx, ns, "arm64"); err != nil {
		t.Fatal(err)
	}
	checkUnprepared(t, node, claim)
	t.Logf("the arm64 plugin under qemu prepared and unprepared claim %s (%d device)", claim.Name, len(claim.Status.Allocation.Devices.Results))

	log, err := os.ReadFile(node.Plugin.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	var excerpt []string
	for _, l := range strings.Split(string(log), "\n") {
		if strings.Contains(l, "=== ") || strings.Contains(l, "\"Starting\" version") || strings.Contains(l, "Start step") ||
			strings.Contains(l, "plugin started") || strings.Contains(l, "repar") {
			excerpt = append(excerpt, l)
		}
	}
	t.Logf("plugin log excerpt (%s):\n%s", node.Plugin.LogPath, strings.Join(excerpt[:min(len(excerpt), 25)], "\n"))
}
