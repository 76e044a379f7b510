// Package scale measures the real kube-scheduler placing our devices on
// hundreds of nodes (issue 14): kwok keeps the Nodes Ready and runs their
// pods, and test/fleet publishes on each node exactly the ResourceSlices
// dra-kubelet-plugin would, from the plugin's own inventory code over a
// mock NVML machine per node. No claim is prepared. `make bench-scale`
// runs the benchmark; TestScaleSmoke, a small run of every mode, is part
// of `make e2e`.
package scale

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

var cp *framework.ControlPlane

func TestMain(m *testing.M) {
	if dir, err := framework.DefaultBinDir(); err == nil && !framework.Required() {
		if _, err := os.Stat(filepath.Join(dir, framework.KwokBinary)); err != nil {
			fmt.Printf("scale: skipped, kwok not found in %s; run `make kwok` (or `make e2e`)\n", dir)
			return
		}
	}
	// Client rates as in upstream's scheduler_perf: the scheduler and the
	// claim-from-template controller are measured, not their throttles.
	os.Exit(framework.MainWith(m, framework.Options{Verbosity: 1, ClientQPS: 5000}, setup))
}

// setup starts kwok and applies the DeviceClasses the modes use.
func setup(c *framework.ControlPlane) error {
	cp = c
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	root, err := framework.RepoRoot()
	if err != nil {
		return err
	}
	if _, err := c.StartKwok(ctx); err != nil {
		return err
	}
	for _, dir := range []string{"demo/specs/00-catalog", "demo/specs/sharing/00-classes"} {
		if _, err := c.Apply(ctx, filepath.Join(root, dir), ""); err != nil {
			return fmt.Errorf("applying %s: %w", dir, err)
		}
	}
	for _, profile := range mixedProfiles {
		if _, err := c.Client.ResourceV1().DeviceClasses().Create(ctx, migClass(profile), createOpts); err != nil {
			return fmt.Errorf("creating the DeviceClass of MIG profile %s: %w", profile, err)
		}
	}
	return nil
}
