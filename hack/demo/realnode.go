package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpuaas/gpu-dra-driver/hack/nvmlshim/shimbuild"
	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

// The demo's release of the chart on the real node.
const (
	demoRelease   = "gpuaas"
	demoNamespace = "gpuaas-system"
)

// gpuNode is what the report needs of a node, simulated or real.
type gpuNode interface {
	WaitForDevices(ctx context.Context, min int) ([]resourceapi.Device, error)
	CDISpecPath(claimUID types.UID) string
}

// realNodeUnavailable says why this machine cannot run a real node, or ""
// when it can.
func realNodeUnavailable(cp *framework.ControlPlane) string {
	if why := framework.RealNodeUnavailable(cp.BinDir); why != "" {
		return why
	}
	if _, err := os.Stat(helmBinary(cp)); err != nil {
		return "helm not built (make helm)"
	}
	return ""
}

func helmBinary(cp *framework.ControlPlane) string { return filepath.Join(cp.BinDir, "helm") }

// startRealNode starts containerd and the kubelet, then installs the Helm
// chart: the plugin DaemonSet and the controller run as pods.
func (d *demo) startRealNode(ctx context.Context) error {
	d.out.printf("Building images (plugin + controller, gpuinfo workload, pause) ...\n")
	images, err := framework.BuildNodeImages(ctx, d.cp.Dir)
	if err != nil {
		return err
	}
	// The plugin runs the production NVML path, go-nvml over a
	// libnvidia-ml.so.1 in its driver root, here the simulated one.
	root, err := framework.RepoRoot()
	if err != nil {
		return err
	}
	d.out.printf("Building the simulated NVML library (hack/nvmlshim, cached) ...\n")
	lib, _, err := shimbuild.Library(root)
	if err != nil {
		return err
	}
	d.out.printf("Starting real node %s (containerd, runc, kubelet; plugin with --nvml real on the simulated NVML library, machine %s) ...\n",
		d.opts.nodeName, strings.TrimPrefix(d.opts.nvml, "mock:"))
	begin := time.Now()
	d.real, err = d.cp.StartRealNode(ctx, framework.RealNodeOptions{Name: d.opts.nodeName, Images: images, NVMLLibrary: lib})
	if err != nil {
		return err
	}
	d.out.printf("  ready in %.1fs; driver root %s\n", time.Since(begin).Seconds(), d.real.DriverRoot)
	d.out.printf("helm install %s (plugin DaemonSet, controller Deployment, CRDs, RBAC, webhook) ...\n", demoRelease)
	values, err := d.real.ChartValues(2)
	if err != nil {
		return err
	}
	// The framework's values describe the 8 x H100 layout of
	// demo/node-config.yaml; the plugin is to run what --nvml and
	// --node-config say, as on the simulated node.
	if values, err = withMachine(values, d.opts.nvml, d.opts.nodeConfigValue); err != nil {
		return err
	}
	if err := d.real.InstallChart(ctx, helmBinary(d.cp), demoRelease, demoNamespace, values); err != nil {
		return err
	}
	d.node, d.nodeCDIRoot = d.real, d.real.CDIRoot
	return d.describeNode(ctx)
}

// reportContainers prints what each container of a pod on the real node saw
// (the gpuinfo workload's report: NVIDIA_* variables, device nodes, extra
// mounts).
func (d *demo) reportContainers(pod *v1.Pod) {
	if d.real == nil || pod.Status.Phase != v1.PodRunning {
		return
	}
	for _, c := range pod.Spec.Containers {
		log, err := framework.ReadContainerLog(d.real.PodLogsDir, pod, c.Name)
		if err != nil {
			d.out.printf("  container %s: %v\n", c.Name, err)
			continue
		}
		var saw []string
		for _, line := range strings.Split(strings.TrimSpace(log), "\n") {
			if line != "gpuinfo done" && !strings.HasPrefix(line, "mount ") {
				saw = append(saw, line)
			}
		}
		d.out.printf("  container %s saw: %s\n", c.Name, strings.Join(saw, "; "))
	}
}

// stopRealNode uninstalls the release (the plugin unprepares what is left)
// and stops the node.
func (d *demo) stopRealNode(ctx context.Context) error {
	var errs []error
	if _, err := d.cp.Helm(ctx, helmBinary(d.cp), "uninstall", demoRelease, "--namespace", demoNamespace, "--wait"); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(append(errs, d.real.Stop(ctx))...)
}
