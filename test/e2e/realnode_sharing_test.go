package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/gpuaas/gpu-dra-driver/pkg/mps"
	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

// mpsDaemonSelector finds the MPS control daemon pods of the plugin.
const mpsDaemonSelector = "app.kubernetes.io/component=mps-control-daemon"

// testSharingTools (issue 11 items 6 and 10, on the real node): one pod
// holds a replica of the Long-interval GPU and an MPS share, selected by
// the published settings. The interval is set with the driver root's
// nvidia-smi; the GPU's MPS daemon runs in a pod of its own on the node,
// owned by the plugin's DaemonSet, and the container reaches it through
// its pipe directory and shares its /dev/shm. The daemon outlives a
// restart of the plugin pod; unpreparing resets the interval, quits the
// daemon and deletes its pod.
func testSharingTools(t *testing.T, n *realNode) {
	ctx := framework.Context(t, 5*time.Minute)
	applySharingClasses(t, ctx)
	if !suiteShape(t).shares {
		// MPS rides on GPU 5's memory share: without consumable capacity
		// (1.34, or 1.35 without its gate) the plugin does not publish it.
		checkNotPublished(t, ctx, n.Name, mpsGPU)
		return
	}
	ns := cp.CreateNamespace(t, "real-sharing-tools")
	tsUUID := gpuUUIDOf(t, ctx, n.Name, longIntervalGPU)
	mpsUUID := gpuUUIDOf(t, ctx, n.Name, mpsGPU)
	mpsDir := filepath.Join(n.KubeletDir, "plugins", framework.DriverName, "mps")

	pod := workloadPod(ns, "long-and-mps")
	// An unprivileged user, as most workloads run: it must reach the MPS
	// daemon and write to the shared /dev/shm.
	pod.Spec.SecurityContext = &v1.PodSecurityContext{RunAsUser: ptr.To[int64](1000), RunAsGroup: ptr.To[int64](1000)}
	for name, sel := range map[string][2]string{"long": {"timeslice.gpuaas.io", onLongGPU}, "mps": {"shared.gpuaas.io", onMPSGPU}} {
		tmpl := templateFor(name, ns, sel[0])
		tmpl.Spec.Spec.Devices.Requests[0].Exactly.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: sel[1]}}}
		if _, err := cp.Client.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		pod.Spec.ResourceClaims = append(pod.Spec.ResourceClaims, v1.PodResourceClaim{Name: name, ResourceClaimTemplateName: ptr.To(name)})
		pod.Spec.Containers[0].Resources.Claims = append(pod.Spec.Containers[0].Resources.Claims, v1.ResourceClaim{Name: name})
	}
	pod = createAndRun(t, ctx, pod)
	checkContainerSawClaims(t, ctx, n, pod, "ctr")
	checkDriverLibraries(t, waitToolCall(t, ctx, n.ToolCalls, setTimeslice(tsUUID, 3)), n.DriverRoot)
	daemon := mpsDaemonPod(t, ctx, n.Name, mpsUUID)
	checkDaemonLimits(t, ctx, n, pod, mpsDir, mpsUUID)
	// The container's cuInit reached the daemon through its pipe
	// directory, and the daemon, inside the driver root, found and started
	// NVIDIA's MPS server for it (which needs a GPU to live on). In the
	// foreground the daemon logs to its pod's log.
	for _, want := range []string{"NEW CLIENT", "from user 1000", "Starting new server"} {
		if _, err := n.WaitForPodLogContaining(ctx, releaseNamespace, daemon.Name, "mps-control-daemon", want); err != nil {
			t.Errorf("the MPS daemon of %s did not log %q: %v", mpsUUID, want, err)
		}
	}

	plugin := waitForPluginPod(t, ctx, "")
	if err := cp.Client.CoreV1().Pods(releaseNamespace).Delete(ctx, plugin.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	fresh := waitForPluginPod(t, ctx, plugin.UID)
	if again := mpsDaemonPod(t, ctx, n.Name, mpsUUID); again.UID != daemon.UID || restarts(again) != 0 {
		t.Errorf("the MPS daemon did not outlive the plugin pod %s (now %s): pod %s (%d restarts), was %s",
			plugin.Name, fresh.Name, again.Name, restarts(again), daemon.Name)
	}

	deletePodAndWait(t, ctx, pod)
	waitToolCall(t, ctx, n.ToolCalls, setTimeslice(tsUUID, 0))
	gpuDir := (&mps.Daemons{Dir: mpsDir}).GPUDir(mpsUUID)
	err := wait.PollUntilContextTimeout(ctx, time.Second, time.Minute, true, func(context.Context) (bool, error) {
		_, err := os.Stat(gpuDir)
		return os.IsNotExist(err), nil
	})
	if err != nil {
		t.Errorf("the MPS directory %s of the GPU's quit daemon is left: %v", gpuDir, err)
	}
	err = wait.PollUntilContextCancel(ctx, time.Second, true, func(ctx context.Context) (bool, error) {
		pods, err := cp.Client.CoreV1().Pods(releaseNamespace).List(ctx, metav1.ListOptions{LabelSelector: mpsDaemonSelector})
		return err == nil && len(pods.Items) == 0, nil
	})
	if err != nil {
		t.Errorf("MPS daemon pods left after the GPU's last claim: %v", err)
	}
}

// checkDaemonLimits reads the GPU's real MPS control daemon's default
// limits back: they bind a client whatever its environment says, and are
// the node configuration's (the largest share one claim may take of the
// GPU, as published), never a claim's. The client's environment is its
// own share, within them.
func checkDaemonLimits(t *testing.T, ctx context.Context, n *realNode, pod *v1.Pod, mpsDir, uuid string) {
	t.Helper()
	log, err := n.WaitForPodLog(ctx, pod.Namespace, pod.Name, "ctr", "gpuinfo done")
	if err != nil {
		t.Fatal(err)
	}
	var pct, mem string
	for _, l := range strings.Split(log, "\n") {
		if v, ok := strings.CutPrefix(l, "env "+mps.EnvThreads+"="); ok {
			pct = v
		}
		if v, ok := strings.CutPrefix(l, "env "+mps.EnvPinnedMemLimit+"="+uuid+"="); ok {
			mem = v
		}
	}
	if pct == "" || mem == "" {
		t.Fatalf("the MPS client has no limits in its environment:\n%s", log)
	}
	largest, total := largestShare(t, ctx, n.Name, mpsGPU)
	wantPct := min(100, (largest*100+total-1)/total)
	if got := askMPSDaemon(t, ctx, n, mpsDir, uuid, "get_default_active_thread_percentage"); got != fmt.Sprintf("%d.0", wantPct) {
		t.Errorf("MPS daemon of %s: default thread percentage %q, want the node configuration's largest share's %d", uuid, got, wantPct)
	}
	got := askMPSDaemon(t, ctx, n, mpsDir, uuid, "get_default_device_pinned_mem_limit 0")
	if mps.ParseMemLimit(got) != largest {
		t.Errorf("MPS daemon of %s: default pinned memory limit %q, want the node configuration's largest share, %d bytes", uuid, got, largest)
	}
	if c, err := strconv.Atoi(pct); err != nil || int64(c) > wantPct || mps.ParseMemLimit(mem) > largest {
		t.Errorf("the client's limits (threads %s, memory %s) are not within the daemon's", pct, mem)
	}
}

// largestShare is the most memory one claim may take of the shared GPU at
// index (its memory capacity's validRange.max, else all of it), and the
// GPU's memory, as the node publishes them.
func largestShare(t *testing.T, ctx context.Context, node string, index int64) (largest, total int64) {
	t.Helper()
	for _, d := range devicesOfGPUIndex(t, ctx, node, index) {
		c, ok := d.Capacity["memory"]
		if !ok || stringAttr(d, "type") != "shared" {
			continue
		}
		total, largest = c.Value.Value(), c.Value.Value()
		if p := c.RequestPolicy; p != nil && p.ValidRange != nil && p.ValidRange.Max != nil {
			largest = p.ValidRange.Max.Value()
		}
		return largest, total
	}
	t.Fatalf("node %s publishes no shared device of GPU %d", node, index)
	return 0, 0
}

// askMPSDaemon sends one command to a GPU's real MPS control daemon, the
// way the plugin does (the driver root's nvidia-cuda-mps-control as a
// client, on the daemon's pipe directory), and returns its answer.
func askMPSDaemon(t *testing.T, ctx context.Context, n *realNode, mpsDir, uuid, command string) string {
	t.Helper()
	cmd := exec.CommandContext(ctx, filepath.Join(n.DriverRoot, "usr/bin", mps.ControlBinary))
	cmd.Env = []string{mps.EnvPipeDir + "=" + (&mps.Daemons{Dir: mpsDir}).PipeDir(uuid)}
	cmd.Stdin = strings.NewReader(command + "\n")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("asking the MPS daemon of %s %q: %v: %s", uuid, command, err, out)
	}
	t.Logf("MPS daemon of %s: %s -> %s", uuid, command, strings.TrimSpace(string(out)))
	return strings.TrimSpace(string(out))
}

// mpsDaemonPod waits for the running daemon pod of a GPU and checks where
// it runs and who owns it.
func mpsDaemonPod(t *testing.T, ctx context.Context, node, uuid string) *v1.Pod {
	t.Helper()
	var pod *v1.Pod
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		pods, err := cp.Client.CoreV1().Pods(releaseNamespace).List(ctx, metav1.ListOptions{
			LabelSelector: mpsDaemonSelector + ",gpu.gpuaas.io/gpu=" + strings.ToLower(uuid)})
		if err != nil || len(pods.Items) != 1 || pods.Items[0].Status.Phase != v1.PodRunning {
			return false, nil
		}
		pod = &pods.Items[0]
		return true, nil
	})
	if err != nil {
		t.Fatalf("no running MPS daemon pod for %s: %v", uuid, err)
	}
	// NVIDIA's control daemon runs inside the driver root, with the
	// host's PIDs (an MPS server looks itself up in /proc).
	if cmd := strings.Join(pod.Spec.Containers[0].Command, " "); !pod.Spec.HostPID || !strings.Contains(cmd, mps.ExecInRootCommand) {
		t.Errorf("MPS daemon pod %s: hostPID %v, command %s; want the host's PIDs and the daemon inside the driver root", pod.Name, pod.Spec.HostPID, cmd)
	}
	if owners := pod.OwnerReferences; pod.Spec.NodeName != node || len(owners) != 1 || owners[0].Kind != "DaemonSet" {
		t.Errorf("MPS daemon pod %s on node %q owned by %+v; want node %s and the plugin's DaemonSet", pod.Name, pod.Spec.NodeName, owners, node)
	}
	return pod
}

func restarts(p *v1.Pod) int32 {
	var n int32
	for _, s := range p.Status.ContainerStatuses {
		n += s.RestartCount
	}
	return n
}

// checkMPSClientView checks that a container holding an MPS device got
// what its claim's CDI spec promised: the pipe directory (variable and
// mount) and the GPU's shared /dev/shm.
func checkMPSClientView(t *testing.T, n *realNode, claim *resourceapi.ResourceClaim, log string) {
	t.Helper()
	for _, env := range specDeviceEnv(t, n, claim) {
		for _, e := range env {
			pipe, ok := strings.CutPrefix(e, "CUDA_MPS_PIPE_DIRECTORY=")
			if !ok {
				continue
			}
			lines := strings.Split(log, "\n")
			for _, want := range []string{"env " + e, "mount " + pipe} {
				if !slices.Contains(lines, want) {
					t.Errorf("MPS client of claim %s lacks %q:\n%s", claim.Name, want, log)
				}
			}
			// /dev/shm is the GPU's tmpfs, which the daemon mounts too
			// (the same file system as on the host), and any user may
			// write there.
			var st unix.Stat_t
			shm := filepath.Join(filepath.Dir(pipe), "shm")
			if err := unix.Stat(shm, &st); err != nil {
				t.Fatalf("the GPU's shared memory: %v", err)
			}
			want := fmt.Sprintf("shm / dev=%d:%d fs=tmpfs", unix.Major(st.Dev), unix.Minor(st.Dev))
			for _, w := range []string{want, "shm writable=true"} {
				if !slices.Contains(lines, w) {
					t.Errorf("MPS client of claim %s lacks %q (the GPU's tmpfs %s):\n%s", claim.Name, w, shm, log)
				}
			}
		}
	}
}

// checkNotPublished: the node offers no device of GPU index.
func checkNotPublished(t *testing.T, ctx context.Context, node string, index int64) {
	t.Helper()
	if devices := devicesOfGPUIndex(t, ctx, node, index); len(devices) > 0 {
		t.Fatalf("node %s publishes %s of GPU %d, which this version cannot keep apart", node, devices[0].Name, index)
	}
	t.Logf("GPU %d (a memory share with MPS) is not offered on this version: it needs DRAConsumableCapacity", index)
}
