package framework

import (
	"os"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	kubeletconfig "k8s.io/kubelet/config/v1beta1"
	"sigs.k8s.io/yaml"
)

// TestKubeletEvictsOnlyOnANearlyFullDisk: the real node shares the
// machine's disk with the build cache and every other test. A percentage
// threshold scales with the disk (1% of a 252 GiB CI disk is 2.5 GiB), so a
// busy but healthy machine put the node under DiskPressure, and the kubelet
// tried to evict the plugin and refused new pods for the rest of the suite.
// The disk signals must be small absolute amounts.
func TestKubeletEvictsOnlyOnANearlyFullDisk(t *testing.T) {
	n := &RealNode{CgroupRoot: "/gpuaas", ContainerdSocket: "/run/c.sock", PodLogsDir: "/logs", Dir: t.TempDir()}
	path, err := n.writeKubeletConfig(10250, 10248)
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var cfg kubeletconfig.KubeletConfiguration
	if err := yaml.UnmarshalStrict(data, &cfg); err != nil {
		t.Fatalf("kubelet config does not parse as a KubeletConfiguration: %v", err)
	}
	limit := resource.MustParse("512Mi")
	for _, signal := range []string{"nodefs.available", "imagefs.available"} {
		v, ok := cfg.EvictionHard[signal]
		if !ok {
			t.Errorf("evictionHard has no %s: the kubelet's default (10%%/15%%) applies", signal)
			continue
		}
		if strings.HasSuffix(v, "%") {
			t.Errorf("evictionHard %s=%s is a share of the disk; want an absolute amount", signal, v)
			continue
		}
		if q, err := resource.ParseQuantity(v); err != nil || q.Cmp(limit) > 0 {
			t.Errorf("evictionHard %s=%s: want a quantity of at most %s (%v)", signal, v, limit.String(), err)
		}
	}
}
