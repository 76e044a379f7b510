// Package e2e tests the driver against a real control plane: the
// dra-kubelet-plugin binary runs for a simulated node (mock NVML) and the
// kubelet side is driven through the plugin's gRPC API by
// test/kubeletsim. Run with `make e2e`; without the control-plane binaries
// plain `go test` skips the package with one line.
package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

var (
	cp           *framework.ControlPlane
	pluginBinary string
	repoRoot     string
)

func TestMain(m *testing.M) {
	os.Exit(framework.Main(m, setup))
}

// setup builds the plugin, sends the simulators' logs to a file and applies
// the DeviceClass catalog every test uses.
func setup(c *framework.ControlPlane) error {
	cp = c
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var err error
	if repoRoot, err = framework.RepoRoot(); err != nil {
		return err
	}
	if err := framework.LogToFile(filepath.Join(c.LogDir, "kubeletsim.log"), 4); err != nil {
		return err
	}
	// TestRealNodePrometheus needs the pinned Prometheus; under `make e2e`
	// its absence fails the suite rather than skipping the test.
	if why := framework.PrometheusUnavailable(c.BinDir); why != "" && framework.Required() {
		return fmt.Errorf("%s (E2E_REQUIRED=1)", why)
	}
	if pluginBinary, err = framework.BuildPlugin(ctx, c.Dir); err != nil {
		return err
	}
	if _, err := c.Apply(ctx, filepath.Join(repoRoot, "demo", "specs", "00-catalog"), ""); err != nil {
		return fmt.Errorf("applying the catalog: %w", err)
	}
	return nil
}

// startNode starts a fresh 8 x H100 node for one test and removes it when
// the test ends. Every test has its own node, so a test that leaves GPUs
// allocated cannot starve the next one. Namespaces created later are
// cleaned up first (cleanups run last-in first-out), while the node can
// still unprepare.
func startNode(t *testing.T) *framework.Node {
	t.Helper()
	return startNodeWith(t, framework.NodeOptions{Name: nodeName(t), NodeConfig: filepath.Join(repoRoot, "demo", "node-config.yaml")})
}

// startNodeWith is startNode with the node's options (the test's plugin
// binary is filled in).
func startNodeWith(t *testing.T, opts framework.NodeOptions) *framework.Node {
	t.Helper()
	ctx := framework.Context(t, 3*time.Minute)
	opts.PluginBinary = pluginBinary
	node, err := cp.StartNode(ctx, opts)
	if err != nil {
		t.Fatalf("starting node: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("plugin log %s, last lines:\n%s", node.Plugin.LogPath, node.Plugin.Tail(40))
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := node.Stop(ctx); err != nil {
			t.Errorf("stopping node: %v", err)
		}
	})
	return node
}

var notDNS = regexp.MustCompile(`[^a-z0-9]+`)

// nodeName derives a valid, readable node name from the test name.
func nodeName(t *testing.T) string {
	name := strings.Trim(notDNS.ReplaceAllString(strings.ToLower(t.Name()), "-"), "-")
	return "node-" + name[:min(len(name), 50)]
}
