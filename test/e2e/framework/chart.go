package framework

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/yaml"
)

// ChartPath is the Helm chart, relative to the repository root.
const ChartPath = "deployments/helm/gpuaas-dra"

// RunHelm runs helm in the repository root with its configuration, cache
// and data in a temporary directory and a kubeconfig that does not exist,
// so it never touches the user's settings or a real cluster. It returns
// the combined output.
func RunHelm(ctx context.Context, helmBinary string, args ...string) (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	home, err := os.MkdirTemp("", "helm-home-")
	if err != nil {
		return "", fmt.Errorf("creating helm home: %w", err)
	}
	defer func() { _ = os.RemoveAll(home) }()
	cmd := exec.CommandContext(ctx, helmBinary, args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "HELM_CONFIG_HOME="+home, "HELM_CACHE_HOME="+home,
		"HELM_DATA_HOME="+home, "KUBECONFIG="+filepath.Join(home, "none"))
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// Helm runs helm (RunHelm) against the control plane; the error carries
// helm's output.
func (cp *ControlPlane) Helm(ctx context.Context, helmBinary string, args ...string) (string, error) {
	out, err := RunHelm(ctx, helmBinary, append(args, "--kubeconfig", cp.Kubeconfig)...)
	if err != nil {
		return out, fmt.Errorf("helm %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return out, nil
}

// UninstallChart removes a release and waits for its objects to go. A
// release already gone is no error, so a test that uninstalls as one of its
// steps can still register this as its cleanup. When the wait fails (a node
// under pressure, a pod stuck terminating), the release is removed again
// without waiting, so that its name is free for the next test and one
// failure does not fail every later install ("cannot re-use a name that is
// still in use"); the wait's error is returned all the same.
func (cp *ControlPlane) UninstallChart(ctx context.Context, helmBinary, release, namespace string) error {
	_, err := cp.Helm(ctx, helmBinary, "uninstall", release, "--namespace", namespace, "--ignore-not-found", "--wait", "--timeout", "2m")
	if err == nil {
		return nil
	}
	if _, again := cp.Helm(ctx, helmBinary, "uninstall", release, "--namespace", namespace, "--ignore-not-found", "--no-hooks"); again != nil {
		return errors.Join(err, fmt.Errorf("removing the release without waiting: %w", again))
	}
	return fmt.Errorf("%w (the release was then removed without waiting)", err)
}

// ChartValues are the chart values for this node: the locally built image,
// the node's directories, a mock NVML with the GPU modes of
// demo/node-config.yaml (the simulated nodes' --node-config), and both components on the host network (the
// node has no pod network) reaching the API server at its own address (no
// kube-proxy routes the kubernetes Service). The catalog is left out: the
// demo specs bring their own DeviceClasses.
func (n *RealNode) ChartValues(verbosity int) (string, error) {
	return n.ChartValuesWithImage(verbosity, DriverImageRepository, DriverImageTag, "Never")
}

// ChartValuesWithImage are ChartValues with another image: a repository,
// a tag (empty: the chart's appVersion) and a pull policy, for a node
// that pulls the release from a registry.
func (n *RealNode) ChartValuesWithImage(verbosity int, repository, tag, pullPolicy string) (string, error) {
	nodeConfig, err := demoNodeConfig()
	if err != nil {
		return "", err
	}
	ports, err := FreePorts(5)
	if err != nil {
		return "", err
	}
	apiHost, apiPort, _ := strings.Cut(strings.TrimPrefix(n.cp.Config.Host, "https://"), ":")
	backend, nvmlEnv := "mock:dgxh100", ""
	if n.SimulatedNVML {
		// The production path on the simulated library: the machine the
		// mock backend would simulate, in the state directory it would
		// keep (MOCK_NVML_STATE_DIR of the chart), UUIDs from the node
		// name as the mock's. It reports the version of NVIDIA's userspace
		// in the driver root it is loaded from.
		backend = "real"
		nvmlEnv = fmt.Sprintf(`
- {name: GPUAAS_MOCK_NVML_MACHINE, value: dgxh100}
- {name: GPUAAS_MOCK_NVML_STATE_DIR, value: %q}
- {name: GPUAAS_MOCK_NVML_SEED, valueFrom: {fieldRef: {fieldPath: spec.nodeName}}}`,
			n.Machine().StateDir)
	}
	return fmt.Sprintf(`
logVerbosity: %d
image:
  repository: %s
  tag: %q
  pullPolicy: %s
extraEnv:
- {name: KUBERNETES_SERVICE_HOST, value: %q}
- {name: KUBERNETES_SERVICE_PORT, value: %q}%s
kubeletPlugin:
  kubeletDir: %s
  cdiRoot: %s
  driverRoot: %s
  nvmlBackend: %s
  hostNetwork: true
  metricsPort: %d
  healthcheckPort: %d
  nodeConfig: %s
controller:
  # One replica: on the host network of a single node two would collide on
  # their ports.
  replicas: 1
  # The tests' namespaces belong to no tenant unless a test makes one.
  denyUnassigned: false
  # The demo's queueing scenario runs Kueue in front of the quota.
  kueue: true
  hostNetwork: true
  metricsPort: %d
  healthPort: %d
  webhookPort: %d
# null deletes a default entry of the catalog.
gpuProfiles: {gpu: null, mig-1g: null}
`, verbosity, repository, tag, pullPolicy, apiHost, apiPort, nvmlEnv,
		n.KubeletDir, n.CDIRoot, n.DriverRoot, backend, ports[0], ports[1], nodeConfig, ports[2], ports[3], ports[4]), nil
}

// demoNodeConfig is demo/node-config.yaml as the chart's nodeConfig value
// (its content without apiVersion and kind), in JSON, which is YAML too.
func demoNodeConfig() (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	data, err := os.ReadFile(filepath.Join(root, "demo", "node-config.yaml"))
	if err != nil {
		return "", fmt.Errorf("reading the demo node configuration: %w", err)
	}
	var cfg map[string]any
	if err := yaml.Unmarshal(data, &cfg); err != nil {
		return "", fmt.Errorf("decoding the demo node configuration: %w", err)
	}
	delete(cfg, "apiVersion")
	delete(cfg, "kind")
	out, err := json.Marshal(cfg)
	if err != nil {
		return "", fmt.Errorf("encoding the node configuration: %w", err)
	}
	return string(out), nil
}

// WriteValues writes chart values to a file in the node's directory.
func (n *RealNode) WriteValues(name, values string) (string, error) {
	path := filepath.Join(n.Dir, name)
	if err := os.WriteFile(path, []byte(values), 0o600); err != nil {
		return "", fmt.Errorf("writing chart values: %w", err)
	}
	return path, nil
}

// ComponentPods lists the pods of one of the chart's components
// ("kubelet-plugin", "controller") in namespace.
func (cp *ControlPlane) ComponentPods(ctx context.Context, namespace, component string) ([]v1.Pod, error) {
	list, err := cp.Client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{
		LabelSelector: "app.kubernetes.io/component=" + component})
	if err != nil {
		return nil, fmt.Errorf("listing %s pods: %w", component, err)
	}
	return list.Items, nil
}

// WaitForPluginPod waits until the node runs exactly one plugin pod, ready
// and not old (after a rollout: the new one), and returns it.
func (cp *ControlPlane) WaitForPluginPod(ctx context.Context, namespace string, old types.UID) (*v1.Pod, error) {
	var pod *v1.Pod
	err := wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		pods, err := cp.ComponentPods(ctx, namespace, "kubelet-plugin")
		if err != nil {
			return false, err
		}
		pod = nil
		for i := range pods {
			if p := &pods[i]; p.UID != old && p.DeletionTimestamp == nil && PodReady(p) {
				pod = p
			}
		}
		return pod != nil && len(pods) == 1, nil
	})
	if err != nil {
		return nil, fmt.Errorf("no single ready plugin pod: %w", err)
	}
	return pod, nil
}

// WaitForControllerReady waits until every controller pod is ready.
func (cp *ControlPlane) WaitForControllerReady(ctx context.Context, namespace string) error {
	err := wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		pods, err := cp.ComponentPods(ctx, namespace, "controller")
		if err != nil || len(pods) == 0 {
			return false, err
		}
		for i := range pods {
			if !PodReady(&pods[i]) {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("controller pods not ready: %w", err)
	}
	return nil
}

// PodReady reports the pod's Ready condition.
func PodReady(p *v1.Pod) bool { return podCondition(p, v1.PodReady) == v1.ConditionTrue }

// installTimeout bounds InstallChart.
const installTimeout = 5 * time.Minute

// InstallChart installs the chart as release into namespace with values and
// waits for the plugin pod, the node's devices and the controller.
func (n *RealNode) InstallChart(ctx context.Context, helmBinary, release, namespace, values string) error {
	return n.InstallChartFrom(ctx, helmBinary, release, namespace, values, ChartPath)
}

// InstallChartFrom is InstallChart of another chart: chart and extra are
// helm install's chart argument and flags, e.g. "oci://127.0.0.1:5000/gpuaas/charts/gpuaas-dra"
// and "--version", "0.2.0", "--plain-http", as a user installs a release.
func (n *RealNode) InstallChartFrom(ctx context.Context, helmBinary, release, namespace, values, chart string, extra ...string) error {
	ctx, cancel := context.WithTimeout(ctx, installTimeout)
	defer cancel()
	file, err := n.WriteValues("values-install.yaml", values)
	if err != nil {
		return err
	}
	args := append([]string{"install", release, chart, "--namespace", namespace, "--create-namespace", "-f", file}, extra...)
	if _, err := n.cp.Helm(ctx, helmBinary, args...); err != nil {
		return err
	}
	if _, err := n.cp.WaitForPluginPod(ctx, namespace, ""); err != nil {
		return fmt.Errorf("%w (plugin pod logs under %s)", err, n.PodLogsDir)
	}
	if _, err := n.WaitForDevices(ctx, 1); err != nil {
		return err
	}
	return n.cp.WaitForControllerReady(ctx, namespace)
}

// WaitForDevices waits for the node's complete pool with at least min
// devices and returns them.
func (n *RealNode) WaitForDevices(ctx context.Context, min int) ([]resourceapi.Device, error) {
	var devices []resourceapi.Device
	err := wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		var err error
		devices, err = n.cp.PoolDevices(ctx, n.Name)
		return len(devices) >= min, err
	})
	if err != nil {
		return nil, fmt.Errorf("node %s publishes %d devices, want %d: %w", n.Name, len(devices), min, err)
	}
	return devices, nil
}

// PoolDevices returns the devices of the newest complete generation of a
// node's pool of our driver, nil while it is incomplete.
func (cp *ControlPlane) PoolDevices(ctx context.Context, node string) ([]resourceapi.Device, error) {
	list, err := cp.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{
		FieldSelector: resourceapi.ResourceSliceSelectorNodeName + "=" + node})
	if err != nil {
		return nil, fmt.Errorf("listing slices: %w", err)
	}
	var gen, want, have int64
	for _, s := range list.Items {
		gen = max(gen, s.Spec.Pool.Generation)
	}
	var devices []resourceapi.Device
	for _, s := range list.Items {
		if s.Spec.Driver == DriverName && s.Spec.Pool.Generation == gen {
			devices = append(devices, s.Spec.Devices...)
			want, have = s.Spec.Pool.ResourceSliceCount, have+1
		}
	}
	if have == 0 || have != want {
		return nil, nil
	}
	return devices, nil
}

// CDISpecPath is where the plugin writes the CDI spec of a claim.
func (n *RealNode) CDISpecPath(claimUID types.UID) string {
	return filepath.Join(n.CDIRoot, fmt.Sprintf("k8s.%s-claim_%s.json", DriverName, claimUID))
}

// CheckpointPath is the plugin's checkpoint record of a prepared claim, in
// the plugin data directory the chart mounts.
func (n *RealNode) CheckpointPath(claimUID types.UID) string {
	return filepath.Join(n.KubeletDir, "plugins", DriverName, "claims", string(claimUID)+".json")
}
