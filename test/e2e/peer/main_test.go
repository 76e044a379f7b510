// Package peer measures our kubelet plugin and NVIDIA's DRA plugin
// (kubernetes-sigs/dra-driver-nvidia-gpu, gpu-kubelet-plugin) side by side
// in one run (issue 37): one control plane, one simulated node, one
// simulated 8 x H100 machine behind the simulated libnvidia-ml.so.1
// (hack/nvmlshim) that both plugins dlopen through their production NVML
// path. Claims are created with their allocation already in status and
// prepared by calling each plugin's kubelet gRPC API, as the kubelet does.
//
// NVIDIA's module is not served by the Go proxy, so this is no part of CI:
// `make bench-peer NVIDIA_DRA_SRC=<its source tree>` builds its plugin and
// runs BenchmarkPeer. Without PEER_NVIDIA_PLUGIN no control plane starts
// and BenchmarkPeer skips.
package peer

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gpuaas/gpu-dra-driver/hack/nvmlshim/shimbuild"
	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

// Environment the make target sets.
const (
	// envPlugin is the path of NVIDIA's built gpu-kubelet-plugin.
	envPlugin = "PEER_NVIDIA_PLUGIN"
	// envVersion names NVIDIA's snapshot (its commit) in the table.
	envVersion = "PEER_NVIDIA_VERSION"
	// envSlicesOut: where to keep the slices each plugin published
	// (fleet.WriteCapture), for test/e2e/scale's BenchmarkPeerShapes.
	envSlicesOut = "PEER_SLICES_OUT"
	// envSlicesOnly: measure the slices only (and keep them), not the
	// prepares.
	envSlicesOnly = "PEER_SLICES_ONLY"
)

var (
	cp           *framework.ControlPlane
	repoRoot     string
	pluginBinary string // ours
	nvmlLibrary  string // the simulated libnvidia-ml.so.1
)

func TestMain(m *testing.M) {
	if os.Getenv(envPlugin) == "" {
		// The table's own tests still run; BenchmarkPeer skips.
		fmt.Printf("peer: no control plane, %s is not set; run `make bench-peer NVIDIA_DRA_SRC=<NVIDIA's source tree>`\n", envPlugin)
		os.Exit(m.Run())
	}
	os.Exit(framework.MainWith(m, framework.Options{Verbosity: 1}, setup))
}

// setup builds our plugin and the simulated NVML library.
func setup(c *framework.ControlPlane) error {
	cp = c
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	var err error
	if repoRoot, err = framework.RepoRoot(); err != nil {
		return err
	}
	if err := framework.LogToFile(filepath.Join(c.LogDir, "kubeletsim.log"), 2); err != nil {
		return err
	}
	if pluginBinary, err = framework.BuildPlugin(ctx, c.Dir); err != nil {
		return fmt.Errorf("building our plugin: %w", err)
	}
	lib, took, err := shimbuild.Library(repoRoot)
	if err != nil {
		return fmt.Errorf("building the simulated NVML library: %w", err)
	}
	if took > 0 {
		fmt.Fprintf(os.Stderr, "peer: built the simulated NVML library in %s\n", took.Round(time.Second))
	}
	nvmlLibrary = lib
	return nil
}
