package e2e

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

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
	ns := cp.CreateNamespace(t, "real-sharing-tools")
	tsUUID := gpuUUIDOf(t, ctx, n.Name, longIntervalGPU)
	mpsUUID := gpuUUIDOf(t, ctx, n.Name, mpsGPU)
	mpsDir := filepath.Join(n.KubeletDir, "plugins", framework.DriverName, "mps")

	pod := workloadPod(ns, "long-and-mps")
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
	waitToolCall(t, ctx, n.ToolCalls, mpsControl(mpsUUID, "get_default_active_thread_percentage\n"))
	waitDaemonLog(t, ctx, mpsDir, mpsUUID, "Starting control daemon on GPUs "+mpsUUID)
	daemon := mpsDaemonPod(t, ctx, n.Name, mpsUUID)

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
	waitToolCall(t, ctx, n.ToolCalls, mpsControl(mpsUUID, "quit\n"))
	err := wait.PollUntilContextCancel(ctx, time.Second, true, func(ctx context.Context) (bool, error) {
		pods, err := cp.Client.CoreV1().Pods(releaseNamespace).List(ctx, metav1.ListOptions{LabelSelector: mpsDaemonSelector})
		return err == nil && len(pods.Items) == 0, nil
	})
	if err != nil {
		t.Errorf("MPS daemon pods left after the GPU's last claim: %v", err)
	}
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
			// gpuinfo names the source of /dev/shm relative to its
			// filesystem's root: compare the part below the plugin's dir.
			shm := "/mps/" + filepath.Base(filepath.Dir(pipe)) + "/shm"
			if !slices.ContainsFunc(lines, func(l string) bool { return strings.HasPrefix(l, "shm ") && strings.HasSuffix(l, shm) }) {
				t.Errorf("MPS client of claim %s does not share the daemon's /dev/shm (%s):\n%s", claim.Name, shm, log)
			}
		}
	}
}
