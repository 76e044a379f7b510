package e2e

// NVIDIA's real driver userspace on the real node (issue 24): the driver
// root holds Debian's packages of driver 535.261.03 (make driver-userspace),
// which load and run without a GPU and fail exactly where the kernel module
// is missing. In a container, cuInit = 100 (no device), nvmlInit = 9
// (driver not loaded) and nvidia-smi's driver message mean everything up to
// the kernel is right; a loader error means our CDI spec or hooks are not.

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
	"github.com/gpuaas/gpu-dra-driver/test/kubeletsim"
)

// nvidiaSMIDriverMessage is how the real nvidia-smi says it found no
// kernel module.
const nvidiaSMIDriverMessage = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver"

// checkCUDAProbe checks gpuinfo's CUDA probe: with a GPU, libcuda.so.1 and
// libnvidia-ml.so.1 load from the driver's files (the ldcache the hook
// made resolves their sonames) and answer as without a kernel module;
// without one, no NVIDIA library is in the container at all.
func checkCUDAProbe(t *testing.T, who, log string, hasGPU bool) {
	t.Helper()
	lines := strings.Split(log, "\n")
	probe := slices.DeleteFunc(slices.Clone(lines), func(l string) bool {
		return !strings.HasPrefix(l, "cuda ") && !strings.HasPrefix(l, "nvidia-smi ")
	})
	t.Logf("%s: CUDA probe: %s", who, strings.Join(probe, "; "))
	if !hasGPU {
		for _, want := range []string{"cuda libcuda.so.1 dlopen-error=", "cuda libnvidia-ml.so.1 dlopen-error=", "nvidia-smi not-found"} {
			if !slices.ContainsFunc(lines, func(l string) bool { return strings.HasPrefix(l, want) }) {
				t.Errorf("%s holds no GPU but lacks %q: an NVIDIA library or tool reached it\n%s", who, want, log)
			}
		}
		return
	}
	version, err := framework.DriverUserspaceVersion()
	if err != nil {
		t.Fatal(err)
	}
	// An MPS client's cuInit goes to the GPU's control daemon, which
	// starts an MPS server for it; without a GPU the server dies at once
	// and CUDA says 805 (MPS connection failed) instead of 100.
	cuInit := "cuda libcuda.so.1 cuInit=100"
	if slices.ContainsFunc(lines, func(l string) bool { return strings.HasPrefix(l, "env CUDA_MPS_PIPE_DIRECTORY=") }) {
		cuInit = "cuda libcuda.so.1 cuInit=805"
	}
	for _, want := range []string{
		cuInit,
		"cuda libcuda.so.1 path=/usr/lib/x86_64-linux-gnu/libcuda.so." + version,
		"cuda libnvidia-ml.so.1 nvmlInit=9",
		"cuda libnvidia-ml.so.1 path=/usr/lib/x86_64-linux-gnu/libnvidia-ml.so." + version,
	} {
		if !slices.Contains(lines, want) {
			t.Errorf("%s holds a GPU but its CUDA probe lacks %q\n%s", who, want, log)
		}
	}
}

// testRealDriverTools puts the driver's own nvidia-smi in place of its
// stand-in: a container with a GPU runs it and gets the driver's message
// (the binary and its libraries load in the container); a replica of the
// Long-interval GPU cannot be prepared, and the pod's event carries
// nvidia-smi's own message, not a loader error (the plugin ran it with the
// driver's NVML preloaded and the plugin image's libc). A container
// without a claim finds no NVIDIA library.
func testRealDriverTools(t *testing.T, n *realNode) {
	ctx := framework.Context(t, 4*time.Minute)
	ns := cp.CreateNamespace(t, "real-driver-tools")

	bare := createAndRun(t, ctx, workloadPod(ns, "no-claim"))
	log, err := n.WaitForPodLog(ctx, ns, bare.Name, "ctr", "gpuinfo done")
	if err != nil {
		t.Fatal(err)
	}
	checkCUDAProbe(t, "pod no-claim", log, false)

	if err := framework.UseRealNVTool(n.DriverRoot, "nvidia-smi", true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := framework.UseRealNVTool(n.DriverRoot, "nvidia-smi", false); err != nil {
			t.Errorf("putting the stand-in nvidia-smi back: %v", err)
		}
	})
	if _, err := cp.Client.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, templateFor("whole", ns, "gpu.gpuaas.io"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := runTemplatePod(t, ctx, n, ns, "whole", "whole")
	log, err = n.WaitForPodLog(ctx, ns, pod.Name, "ctr", "gpuinfo done")
	if err != nil {
		t.Fatal(err)
	}
	if want := "nvidia-smi exit=9 " + nvidiaSMIDriverMessage; !strings.Contains(log, want) {
		t.Errorf("the driver's nvidia-smi in a GPU container did not answer %q\n%s", want, log)
	}

	applySharingClasses(t, ctx)
	createSelectedPod(t, ctx, ns, "long", "timeslice.gpuaas.io", onLongGPU)
	ev, err := cp.WaitForEvent(ctx, ns, "Pod", "long", kubeletsim.ReasonFailedPrepare, "couldn't communicate with the NVIDIA driver")
	if err != nil {
		t.Fatalf("no FailedPrepareDynamicResources event with nvidia-smi's driver message for the Long-interval replica: %v", err)
	}
	if strings.Contains(ev.Message, "error while loading shared libraries") || strings.Contains(ev.Message, "GLIBC") {
		t.Errorf("nvidia-smi failed to load, not to reach the driver: %s", ev.Message)
	}
	t.Logf("prepare of the Long-interval replica: %s", ev.Message)
	deletePodAndWait(t, ctx, &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "long"}})
}

// testRealNVMLStopsCleanly starts the plugin as the chart runs it, from the
// release image, but with the real NVML backend on NVIDIA's own driver
// userspace without its kernel module: it must stop with one line naming
// NVML's answer and what to do, not crash (a static build segfaulted in
// nvmlInit) or print stack traces. Where the node's plugin runs on the
// simulated library, this pod gets a driver root of NVIDIA's files only.
func testRealNVMLStopsCleanly(t *testing.T, n *realNode) {
	ctx := framework.Context(t, 3*time.Minute)
	plugin := waitForPluginPod(t, ctx, "")
	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "plugin-real-nvml", Namespace: releaseNamespace},
		Spec:       *plugin.Spec.DeepCopy(),
	}
	pod.Spec.RestartPolicy = v1.RestartPolicyNever
	if n.SimulatedNVML {
		useNVIDIAOnlyDriverRoot(t, ctx, n, &pod.Spec)
	}
	ctr := &pod.Spec.Containers[0]
	ctr.LivenessProbe = nil
	ctr.Env = slices.DeleteFunc(ctr.Env, func(e v1.EnvVar) bool {
		return e.Name == "MOCK_NVML_STATE_DIR" || strings.HasPrefix(e.Name, "GPUAAS_MOCK_NVML_")
	})
	for i := range ctr.Env {
		if ctr.Env[i].Name == "NVML_BACKEND" {
			ctr.Env[i].Value = "real"
		}
	}
	if _, err := cp.Client.CoreV1().Pods(releaseNamespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cp.Client.CoreV1().Pods(releaseNamespace).Delete(context.Background(), pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	})
	// No kernel module here: the plugin waits for the driver (issue 25
	// item 5: the GPU Operator's driver pod may not be ready yet), alive
	// and not ready, saying why in one line with NVML's answer and the
	// hint; it neither crashes (the static build segfaulted in nvmlInit)
	// nor exits.
	log, err := n.WaitForPodLogContaining(ctx, releaseNamespace, pod.Name, ctr.Name, "NVIDIA driver not ready; waiting")
	if err != nil {
		t.Fatal(err)
	}
	var waitLine string
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, "NVIDIA driver not ready; waiting") {
			waitLine = l
		}
	}
	if !strings.Contains(waitLine, "Driver Not Loaded") || !strings.Contains(waitLine, "kernel module") ||
		strings.Contains(log, "goroutine ") || strings.Contains(log, "SIGSEGV") {
		t.Fatalf("plugin with real NVML: want a wait naming NVML's answer and the kernel module, no stack trace:\n%s", log)
	}
	// The log is read from the node's disk; the kubelet reports the
	// container running a moment later (1.34's kubelet: seen a second).
	if _, err := cp.WaitForPod(ctx, releaseNamespace, pod.Name, "running and not ready", func(p *v1.Pod) bool {
		s := p.Status.ContainerStatuses
		return len(s) == 1 && s[0].State.Running != nil && !s[0].Ready
	}); err != nil {
		t.Fatalf("plugin waiting for the driver: %v", err)
	}
	t.Logf("plugin with real NVML on the driver root, waiting: %s", waitLine)
}

// useNVIDIAOnlyDriverRoot points a plugin pod's driver-root volume at a
// root of NVIDIA's userspace without the simulated library.
func useNVIDIAOnlyDriverRoot(t *testing.T, ctx context.Context, n *realNode, spec *v1.PodSpec) {
	t.Helper()
	root, err := n.NVIDIADriverRoot(ctx, "nvidia-only-driver", 8)
	if err != nil {
		t.Fatal(err)
	}
	for i := range spec.Volumes {
		if v := &spec.Volumes[i]; v.Name == "driver-root" && v.HostPath != nil {
			v.HostPath.Path = root
			return
		}
	}
	t.Fatalf("the plugin pod has no driver-root hostPath volume: %+v", spec.Volumes)
}

// checkOperatorDriverRoot runs a GPU container after the plugin moved to
// the GPU Operator's driver root: its CDI spec takes the driver's files
// from there, and CUDA loads in the container as before.
func checkOperatorDriverRoot(t *testing.T, ctx context.Context, n *realNode, ns string) {
	t.Helper()
	// The upgrade rolled the controller too: its webhook may be between
	// pods for a moment.
	var createErr error
	err := wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		_, createErr = cp.Client.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, templateFor("operator", ns, "gpu.gpuaas.io"), metav1.CreateOptions{})
		return createErr == nil, nil
	})
	if err != nil {
		t.Fatalf("creating a claim template after the upgrade: %v (%v)", createErr, err)
	}
	pod := runTemplatePod(t, ctx, n, ns, "operator-root", "operator")
	version, err := framework.DriverUserspaceVersion()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range podClaims(t, ctx, pod) {
		data, err := os.ReadFile(n.CDISpecPath(c.UID))
		if err != nil {
			t.Fatal(err)
		}
		if lib := n.DriverRoot + "/usr/lib/x86_64-linux-gnu/libcuda.so." + version; !strings.Contains(string(data), `"hostPath":"`+lib+`"`) {
			t.Errorf("the CDI spec of %s does not take libcuda from the operator's driver root %s:\n%s", c.Name, lib, data)
		}
	}
	deletePodAndWait(t, ctx, pod)
}
