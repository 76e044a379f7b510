package e2e

// A driver upgrade on the real node (issue 25 item 4). The plugin held its
// NVML session for its whole life, which on a GPU node keeps `rmmod
// nvidia` (the GPU Operator's driver upgrade) and `nvidia-smi -r` from
// proceeding, and it found the driver's files for its CDI specs once, at
// start: after an upgrade every new container was given libraries the
// upgrade had removed. Here the chart's plugin is asked to release the
// GPUs (as `kubectl exec <plugin pod> -- dra-kubelet-plugin --release-gpus`
// does: a request in its data directory, answered there), the mock
// driver's module then unloads (it refuses while a session is open), the
// driver root's real userspace is upgraded (every versioned library
// renamed to the new version, the links re-pointed, as an installer
// leaves them) and the module loaded again. The plugin takes the new
// version up by itself: a new pod's CDI spec mounts the new version's
// libraries and CUDA loads them in its container, while the pod of before
// keeps its spec. Then the GPU Operator's upgrade controller is played on
// the node's label: the plugin releases and reacquires by itself.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev/nvmock"
	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/maintenance"
	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

// upgradedUserspaceVersion is the version the test upgrades the driver
// root to: a later release of the same branch.
const upgradedUserspaceVersion = "535.274.02"

const maintenanceTaintKey = "gpu.gpuaas.io/" + maintenance.KindMaintenance

// TestRealNodeDriverUpgrade installs the chart on its own real node,
// releases the GPUs, upgrades the driver under the plugin and checks that
// new pods get the new driver's files.
func TestRealNodeDriverUpgrade(t *testing.T) {
	requireRealNode(t)
	n := startRealNode(t)
	installChartForTest(t, n)
	ctx := framework.Context(t, 12*time.Minute)
	oldVersion, err := framework.DriverUserspaceVersion()
	if err != nil {
		t.Fatal(err)
	}
	ns := cp.CreateNamespace(t, "driver-upgrade")
	if _, err := cp.Client.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, templateFor("whole", ns, "gpu.gpuaas.io"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	before := runTemplatePod(t, ctx, n, ns, "before", "whole")
	beforeSpec := checkSpecLibraries(t, ctx, n, before, oldVersion)
	pluginPod := waitForPluginPod(t, ctx, "")

	pluginDir := filepath.Join(n.KubeletDir, "plugins", framework.DriverName)
	mockDriver := filepath.Join(pluginDir, "mock-nvml")
	if err := nvmock.UnloadDriver(mockDriver); err == nil {
		t.Fatal("the mock driver unloaded while the plugin holds an NVML session")
	} else {
		t.Logf("unload while the plugin serves: %v", err)
	}
	st := requestMaintenance(t, ctx, pluginDir, maintenance.ActionRelease, maintenance.StateReleased)
	t.Logf("released: %+v", st)
	if err := nvmock.UnloadDriver(mockDriver); err != nil {
		t.Fatalf("unload after the release: %v", err)
	}
	waitDevicesTainted(t, ctx, n, true)
	waitPluginReady(t, ctx, pluginPod, false)

	upgradeUserspace(t, n.DriverRoot, oldVersion, upgradedUserspaceVersion)
	if err := nvmock.LoadDriver(mockDriver); err != nil {
		t.Fatal(err)
	}
	// The plugin sees the new version and starts again in the same
	// container for it: untainted, ready, no container restart.
	waitDevicesTainted(t, ctx, n, false)
	waitPluginReady(t, ctx, pluginPod, true)
	if st, ok, err := maintenance.ReadStatus(maintenance.Dir(pluginDir)); err != nil || !ok || st.State != maintenance.StateServing || st.DriverVersion != upgradedUserspaceVersion {
		t.Errorf("maintenance status after the upgrade: %+v (%v, %v), want serving driver %s", st, ok, err, upgradedUserspaceVersion)
	}

	// Not runTemplatePod: its CUDA probe check expects the userspace's
	// own version.
	after := createAndRun(t, ctx, templateWorkloadPod(ns, "after", "whole"))
	checkSpecLibraries(t, ctx, n, after, upgradedUserspaceVersion)
	log, err := n.WaitForPodLog(ctx, ns, after.Name, "ctr", "gpuinfo done")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"cuda libcuda.so.1 cuInit=100",
		"cuda libcuda.so.1 path=/usr/lib/x86_64-linux-gnu/libcuda.so." + upgradedUserspaceVersion,
		"cuda libnvidia-ml.so.1 path=/usr/lib/x86_64-linux-gnu/libnvidia-ml.so." + upgradedUserspaceVersion,
	} {
		if !strings.Contains(log, want+"\n") {
			t.Errorf("the pod started after the upgrade: its CUDA probe lacks %q\n%s", want, log)
		}
	}
	for _, c := range podClaims(t, ctx, before) {
		data, err := os.ReadFile(n.CDISpecPath(c.UID))
		if err != nil {
			t.Fatal(err)
		}
		if string(data) != beforeSpec[string(c.UID)] {
			t.Errorf("the CDI spec of %s, prepared before the upgrade, changed", c.Name)
		}
	}
	p, err := cp.Client.CoreV1().Pods(releaseNamespace).Get(ctx, pluginPod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if restarts := p.Status.ContainerStatuses[0].RestartCount; restarts != 0 {
		t.Errorf("the plugin container restarted %d times for the upgrade, want it executed again in place", restarts)
	}
	deletePodAndWait(t, ctx, after)
	deletePodAndWait(t, ctx, before)
	followGPUOperatorRestart(t, ctx, n, pluginPod, mockDriver)
}

// followGPUOperatorRestart plays the GPU Operator's upgrade controller on
// the node: its label says pod-restart-required, when the driver pod
// restarts and unloads the module. The chart's plugin, watching its own
// node under the chart's RBAC, lets go of the GPUs by itself (the unload
// succeeds), stays released while the label says so, and takes them back
// when it moves on.
func followGPUOperatorRestart(t *testing.T, ctx context.Context, n *realNode, pluginPod *v1.Pod, mockDriver string) {
	t.Helper()
	setUpgradeState := func(state string) {
		t.Helper()
		patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, maintenance.UpgradeStateLabel, state)
		if _, err := cp.Client.CoreV1().Nodes().Patch(ctx, n.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	setUpgradeState("drain-required")
	setUpgradeState("pod-restart-required")
	waitDevicesTainted(t, ctx, n, true)
	waitPluginReady(t, ctx, pluginPod, false)
	if err := nvmock.UnloadDriver(mockDriver); err != nil {
		t.Fatalf("the driver pod's unload at pod-restart-required: %v", err)
	}
	if err := nvmock.LoadDriver(mockDriver); err != nil {
		t.Fatal(err)
	}
	setUpgradeState("validation-required")
	waitDevicesTainted(t, ctx, n, false)
	waitPluginReady(t, ctx, pluginPod, true)
	if err := nvmock.UnloadDriver(mockDriver); err == nil {
		t.Error("the mock driver unloaded after the upgrade moved on: the plugin holds no NVML session")
	}
}

// checkSpecLibraries checks that the CDI specs of the pod's claims mount
// the libraries of version from the driver root; it returns the specs.
func checkSpecLibraries(t *testing.T, ctx context.Context, n *realNode, pod *v1.Pod, version string) map[string]string {
	t.Helper()
	specs := map[string]string{}
	for _, c := range podClaims(t, ctx, pod) {
		data, err := os.ReadFile(n.CDISpecPath(c.UID))
		if err != nil {
			t.Fatal(err)
		}
		specs[string(c.UID)] = string(data)
		for _, lib := range []string{"libcuda.so.", "libnvidia-ml.so."} {
			path := n.DriverRoot + "/usr/lib/x86_64-linux-gnu/" + lib + version
			if !strings.Contains(string(data), `"hostPath":"`+path+`"`) {
				t.Errorf("the CDI spec of %s (pod %s) does not mount %s:\n%s", c.Name, pod.Name, path, data)
			}
		}
	}
	return specs
}

// requestMaintenance does what `dra-kubelet-plugin --release-gpus` (or
// --reacquire-gpus) does in the plugin pod, from the host: a request in
// the plugin's data directory, and a wait for its answer.
func requestMaintenance(t *testing.T, ctx context.Context, pluginDir, action string, want ...string) maintenance.Status {
	t.Helper()
	dir := maintenance.Dir(pluginDir)
	id, err := maintenance.Request(dir, action)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	st, err := maintenance.Wait(ctx, dir, id, want...)
	if err != nil {
		t.Fatalf("%s: %v (status %+v)", action, err, st)
	}
	return st
}

// waitDevicesTainted waits until every published device carries the
// maintenance taint (tainted) or none does.
func waitDevicesTainted(t *testing.T, ctx context.Context, n *realNode, tainted bool) {
	t.Helper()
	var state string
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		devices, err := cp.PoolDevices(ctx, n.Name)
		if err != nil || len(devices) == 0 {
			return false, err
		}
		var with int
		for _, d := range devices {
			for _, taint := range d.Taints {
				if taint.Key == maintenanceTaintKey {
					with++
				}
			}
		}
		state = fmt.Sprintf("%d of %d devices tainted %s", with, len(devices), maintenanceTaintKey)
		return (tainted && with == len(devices)) || (!tainted && with == 0), nil
	})
	if err != nil {
		t.Fatalf("want tainted=%v: %s: %v", tainted, state, err)
	}
	t.Logf("%s", state)
}

// waitPluginReady waits for the plugin pod's readiness to be ready.
func waitPluginReady(t *testing.T, ctx context.Context, pod *v1.Pod, ready bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := cp.Client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return podReady(p) == ready, nil
	})
	if err != nil {
		t.Fatalf("plugin pod %s: want ready=%v: %v", pod.Name, ready, err)
	}
}

// upgradeUserspace upgrades the driver userspace under root from version
// from to version to, as an installer leaves it: every library of the old
// version renamed to the new one, every link to one re-pointed.
func upgradeUserspace(t *testing.T, root, from, to string) {
	t.Helper()
	dir := filepath.Join(root, "usr/lib/x86_64-linux-gnu")
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var renamed int
	for _, e := range entries {
		if name, ok := strings.CutSuffix(e.Name(), ".so."+from); ok && e.Type().IsRegular() {
			if err := os.Rename(filepath.Join(dir, e.Name()), filepath.Join(dir, name+".so."+to)); err != nil {
				t.Fatal(err)
			}
			renamed++
		}
	}
	for _, e := range entries {
		if e.Type()&os.ModeSymlink == 0 {
			continue
		}
		link := filepath.Join(dir, e.Name())
		target, err := os.Readlink(link)
		if err != nil {
			t.Fatal(err)
		}
		if name, ok := strings.CutSuffix(target, ".so."+from); ok {
			if err := os.Remove(link); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(name+".so."+to, link); err != nil {
				t.Fatal(err)
			}
		}
	}
	if renamed == 0 {
		t.Fatalf("no library of driver %s under %s to upgrade", from, dir)
	}
	t.Logf("driver root %s: %d libraries upgraded from %s to %s", root, renamed, from, to)
}
