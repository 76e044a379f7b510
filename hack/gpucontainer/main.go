// Command gpucontainer shows, on a machine with a real NVIDIA GPU and no
// cluster, what a container with one of the plugin's GPU claims gets: the
// plugin's own CDI spec for a whole GPU (pkg/cdi over the real driver root,
// with nvidia-cdi-hook, as the chart runs it), injected into an OCI spec by
// the CDI library the way containerd does, and run by runc on the workload
// image's root file system with test/images/gpuinfo in it. gpuinfo reports
// where libcuda.so.1 and libnvidia-ml.so.1 were loaded from and what cuInit
// and nvmlInit return: 0 on a real GPU; a dlopen error means the spec left
// a library out. hack/compare-real-gpu.sh runs it. It changes nothing on
// the GPU: no MIG mode change, no reset, no instance created.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/gpuaas/gpu-dra-driver/pkg/plugin/device"

	rspec "github.com/opencontainers/runtime-spec/specs-go"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/gpuaas/gpu-dra-driver/pkg/cdi"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
	_ "github.com/gpuaas/gpu-dra-driver/pkg/nvdev/nvmock" // the mock:<machine> backends
)

// claimUID names the one claim whose spec is written.
const claimUID = "00000000-0000-4000-8000-000000000001"

type options struct {
	nvml                string
	driverRoot, devRoot string
	cdiHook, runc       string
	rootfs, gpuinfo     string
	work                string
	gpu                 int
}

func main() {
	var o options
	flag.StringVar(&o.nvml, "nvml", nvdev.BackendReal, "NVML backend: real, or mock:<machine> to try the tool on a machine without a GPU (the GPU's UUID and minor are then the mock's)")
	flag.StringVar(&o.driverRoot, "driver-root", "/", "root of the NVIDIA driver installation (the chart's nvidiaDriverRoot)")
	flag.StringVar(&o.devRoot, "dev-root", "", "where /dev/nvidia* live; empty: the driver root")
	flag.StringVar(&o.cdiHook, "cdi-hook", "_output/bin/nvidia-cdi-hook", "the nvidia-cdi-hook binary the plugin installs")
	flag.StringVar(&o.runc, "runc", "_output/bin/runc", "the runc binary")
	flag.StringVar(&o.rootfs, "rootfs", "_output/image-base/rootfs", "the workload image's root file system")
	flag.StringVar(&o.gpuinfo, "gpuinfo", "", "the gpuinfo binary (a cgo build of test/images/gpuinfo)")
	flag.StringVar(&o.work, "work", "", "working directory; empty: a new temporary one")
	flag.IntVar(&o.gpu, "gpu", 0, "index of the GPU to claim")
	flag.Parse()
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "gpucontainer:", err)
		os.Exit(1)
	}
}

func run(o options) error {
	// Spec paths are host paths and must be absolute.
	for _, p := range []*string{&o.driverRoot, &o.devRoot, &o.cdiHook, &o.runc, &o.rootfs, &o.gpuinfo, &o.work} {
		if *p == "" {
			continue
		}
		abs, err := filepath.Abs(*p)
		if err != nil {
			return err
		}
		*p = abs
	}
	if o.work == "" {
		dir, err := os.MkdirTemp("", "gpucontainer-")
		if err != nil {
			return err
		}
		o.work = dir
	}
	id, err := writeClaimSpec(o)
	if err != nil {
		return err
	}
	bundle := filepath.Join(o.work, "bundle")
	if err := makeBundle(o, bundle); err != nil {
		return err
	}
	if err := injectAndWrite(o, bundle, id); err != nil {
		return err
	}
	return runContainer(o, bundle)
}

// writeClaimSpec writes the plugin's spec for a claim of the whole GPU
// o.gpu, prints it and returns its CDI device ID.
func writeClaimSpec(o options) (string, error) {
	lib, err := nvdev.Open(nvdev.Options{Backend: o.nvml, DriverRoot: o.driverRoot})
	if err != nil {
		return "", fmt.Errorf("opening NVML: %w", err)
	}
	defer func() { _ = lib.Shutdown() }()
	var gpu *nvdev.GPU
	for _, g := range lib.GPUs() {
		if g.Index == o.gpu {
			gpu = &g
		}
	}
	if gpu == nil {
		return "", fmt.Errorf("no GPU %d among the %d NVML reports", o.gpu, len(lib.GPUs()))
	}
	hook, err := cdi.InstallHook(o.cdiHook, filepath.Join(o.work, "plugin"))
	if err != nil {
		return "", fmt.Errorf("installing nvidia-cdi-hook: %w", err)
	}
	cdiRoot := filepath.Join(o.work, "cdi")
	h, err := cdi.NewHandler(cdi.Options{CDIRoot: cdiRoot, DriverRoot: o.driverRoot, DevRoot: o.devRoot, NVML: lib.NVML(), CDIHookPath: hook})
	if err != nil {
		return "", fmt.Errorf("computing the driver's edits: %w", err)
	}
	name := device.GPUDeviceName(gpu.Index)
	ids, err := h.WriteClaimSpec(claimUID, []cdi.Device{{Name: name, UUID: gpu.UUID, Minor: gpu.Minor}})
	if err != nil {
		return "", err
	}
	spec, err := os.ReadFile(cdi.SpecPath(cdiRoot, claimUID))
	if err != nil {
		return "", err
	}
	fmt.Printf("== the plugin's CDI spec for %s (%s, driver %s)\n%s\n", name, gpu.UUID, h.DriverVersion(), spec)
	return ids[name], nil
}

// makeBundle copies the workload image's root file system and gpuinfo
// into an OCI bundle with runc's default config.json.
func makeBundle(o options, bundle string) error {
	rootfs := filepath.Join(bundle, "rootfs")
	if err := os.MkdirAll(bundle, 0o755); err != nil {
		return err
	}
	if err := command("cp", "-a", o.rootfs, rootfs); err != nil {
		return err
	}
	if err := command("cp", o.gpuinfo, filepath.Join(rootfs, "gpuinfo")); err != nil {
		return err
	}
	return command(o.runc, "spec", "--bundle", bundle)
}

// command runs name with args; its error carries what the command printed.
func command(name string, args ...string) error {
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		return fmt.Errorf("%s %v: %w: %s", name, args, err, out)
	}
	return nil
}

// injectAndWrite makes config.json run gpuinfo once and applies the claim's
// CDI device to it, as containerd does for a pod's CDI devices.
func injectAndWrite(o options, bundle, id string) error {
	path := filepath.Join(bundle, "config.json")
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var spec rspec.Spec
	if err := json.Unmarshal(data, &spec); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	spec.Process.Terminal = false
	spec.Process.Args = []string{"/gpuinfo", "-once"}
	// nvidia-cdi-hook's update-ldcache writes the container's ld.so.cache.
	spec.Root.Readonly = false
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(filepath.Join(o.work, "cdi")), cdiapi.WithAutoRefresh(false))
	if err != nil {
		return fmt.Errorf("reading the CDI spec: %w", err)
	}
	if unresolved, err := cache.InjectDevices(&spec, id); err != nil {
		return fmt.Errorf("injecting %s (unresolved %v): %w", id, unresolved, err)
	}
	if data, err = json.MarshalIndent(&spec, "", "  "); err != nil {
		return err
	}
	fmt.Printf("== the container's mounts and hooks after injection\n")
	for _, m := range spec.Mounts {
		fmt.Printf("mount %s <- %s\n", m.Destination, m.Source)
	}
	if spec.Hooks != nil {
		for _, hk := range spec.Hooks.CreateContainer {
			fmt.Printf("createContainer hook %v\n", hk.Args)
		}
	}
	return os.WriteFile(path, data, 0o644)
}

// runContainer runs the bundle with runc and prints gpuinfo's report.
func runContainer(o options, bundle string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	name := fmt.Sprintf("gpucontainer-%d", os.Getpid())
	cmd := exec.CommandContext(ctx, o.runc, "--root", filepath.Join(o.work, "runc"), "run", "--bundle", bundle, name)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	fmt.Printf("== gpuinfo in the container (runc run)\n")
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("runc run: %w", err)
	}
	return nil
}
