package framework

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// kubeletConfig is the KubeletConfiguration of a real node on a shared
// development machine (shared/notes/real-node.md): cgroup v1 with cgroupfs
// under a cgroup root of its own (so Stop can end every container it ran),
// anonymous and always-allowed access to its own API on private ports, no
// node-allocatable enforcement, and eviction and image GC thresholds loose
// enough that a shared disk never evicts the test's pods: the disk signals
// are absolute, since a share of a large CI disk (1% of 252 GiB) is more
// than a busy build machine keeps free.
const kubeletConfig = `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
cgroupRoot: %[1]s
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://%[2]s
address: 127.0.0.1
port: %[3]d
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: %[4]d
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
authorization: {mode: AlwaysAllow}
enforceNodeAllocatable: []
evictionHard: {memory.available: "1%%", nodefs.available: "256Mi", imagefs.available: "256Mi", nodefs.inodesFree: "1%%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
podLogsDir: %[5]s
volumePluginDir: %[6]s
serializeImagePulls: false
syncFrequency: 5s
fileCheckFrequency: 5s
nodeStatusUpdateFrequency: 5s
`

// writeKubeletConfig writes the kubelet's configuration file and returns
// its path.
func (n *RealNode) writeKubeletConfig(port, healthzPort int) (string, error) {
	cfg := fmt.Sprintf(kubeletConfig, n.CgroupRoot, n.ContainerdSocket, port, healthzPort, n.PodLogsDir,
		filepath.Join(n.Dir, "volume-plugins"))
	path := filepath.Join(n.Dir, "kubelet.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		return "", fmt.Errorf("writing kubelet config: %w", err)
	}
	return path, nil
}

// kubeletArgs is the kubelet's command line.
func (n *RealNode) kubeletArgs(configPath string, labels map[string]string, verbosity int) []string {
	args := []string{
		"--kubeconfig", n.cp.Kubeconfig,
		"--config", configPath,
		"--root-dir", n.KubeletDir,
		"--cert-dir", filepath.Join(n.Dir, "kubelet-pki"),
		"--hostname-override", n.Name,
		"-v", fmt.Sprint(verbosity),
	}
	if len(labels) > 0 {
		pairs := make([]string, 0, len(labels))
		for k, v := range labels {
			pairs = append(pairs, k+"="+v)
		}
		sort.Strings(pairs)
		args = append(args, "--node-labels", strings.Join(pairs, ","))
	}
	return args
}
