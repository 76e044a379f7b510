package framework

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/gpuaas/gpu-dra-driver/hack/image/release"
	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework/ociimage"
)

// Images of the real node, imported into containerd; pods run them with
// imagePullPolicy: Never.
const (
	// DriverImageRepository:DriverImageTag is the release image, the one
	// `make image` builds (the chart's default image and appVersion):
	// the real node runs exactly that artifact.
	DriverImageRepository = "ghcr.io/gpuaas/gpu-dra-driver"
	DriverImageTag        = "0.1.0"
	// WorkloadImage runs test/images/gpuinfo: it prints what the container
	// got from CDI (NVIDIA_* variables, /dev/nvidia* nodes, extra mounts)
	// and what CUDA, NVML and nvidia-smi answer in it.
	WorkloadImage = "localhost/gpuaas/gpuinfo:e2e"
)

// Where `make image` and its inputs (make image-base, make cdi-hook) put
// their output, relative to the repository.
const (
	ReleaseImageTar = "_output/images/gpu-dra-driver-" + DriverImageTag + ".oci.tar"
	imageBaseRootfs = "_output/image-base/rootfs"
	cdiHookBinary   = "_output/bin/nvidia-cdi-hook"
	nvmlHookBinary  = "_output/bin/nvml-hook/nvidia-cdi-hook"
)

// BuildNodeImages builds the sandbox, workload and release images as OCI
// tarballs, for RealNodeOptions.Images: the first two into dir, the
// release image where `make image` writes it, by the same code.
func BuildNodeImages(ctx context.Context, dir string) ([]string, error) {
	images, err := BuildTestImages(ctx, dir)
	if err != nil {
		return nil, err
	}
	driver, err := BuildReleaseImage(ctx)
	if err != nil {
		return nil, err
	}
	return append(images, driver), nil
}

// BuildTestImages builds the sandbox and workload images into dir, for a
// node that pulls the driver's image from a registry instead.
func BuildTestImages(ctx context.Context, dir string) ([]string, error) {
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	pause, err := buildPauseImage(ctx, root, dir)
	if err != nil {
		return nil, err
	}
	workload, err := buildWorkloadImage(ctx, root, dir)
	if err != nil {
		return nil, err
	}
	return []string{pause, workload}, nil
}

// BuildReleaseImage builds the release image as `make image` does.
func BuildReleaseImage(ctx context.Context) (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	return release.Build(ctx, release.Options{
		RepoRoot: root, Version: DriverImageTag, Repository: DriverImageRepository, Revision: release.GitRevision(ctx, root),
		BaseRootfs: filepath.Join(root, imageBaseRootfs), CDIHook: filepath.Join(root, cdiHookBinary),
		NVMLHook: filepath.Join(root, nvmlHookBinary),
		Out:      filepath.Join(root, ReleaseImageTar),
	})
}

// buildPauseImage is the sandbox image: one static binary.
func buildPauseImage(ctx context.Context, root, dir string) (string, error) {
	bin := filepath.Join(dir, "image-bins", "pause")
	if err := ociimage.StaticBinary(ctx, root, "test/images/pause", bin, false); err != nil {
		return "", fmt.Errorf("building the pause image: %w", err)
	}
	return writeImage(dir, ociimage.Image{Name: SandboxImage, Entrypoint: []string{"/pause"},
		Files: []ociimage.File{{Path: "/pause", Source: bin, Mode: 0o755}}})
}

// buildWorkloadImage is gpuinfo, a cgo binary (its CUDA probe dlopens the
// driver's libraries), on the release image's glibc base.
func buildWorkloadImage(ctx context.Context, root, dir string) (string, error) {
	bin := filepath.Join(dir, "image-bins", "gpuinfo")
	if err := ociimage.DynamicBinary(ctx, root, "test/images/gpuinfo", bin, nil); err != nil {
		return "", fmt.Errorf("building the workload image: %w", err)
	}
	base := ociimage.Layer{{Path: "/", Source: filepath.Join(root, imageBaseRootfs), Tree: true}}
	return writeImage(dir, ociimage.Image{Name: WorkloadImage, Entrypoint: []string{"/gpuinfo"},
		Env:    []string{release.DefaultPath},
		Layers: []ociimage.Layer{base}, Files: []ociimage.File{{Path: "/gpuinfo", Source: bin, Mode: 0o755}}})
}

func writeImage(dir string, img ociimage.Image) (string, error) {
	tarball := filepath.Join(dir, filepath.Base(strings.Split(img.Name, ":")[0])+".tar")
	if err := ociimage.WriteTar(img, tarball); err != nil {
		return "", fmt.Errorf("writing image %s: %w", img.Name, err)
	}
	return tarball, nil
}

// UseWorkloadImage makes a pod (read from a demo spec) run the gpuinfo
// workload on the host network: the demo's pause image prints nothing, and
// the real node has no pod network.
func UseWorkloadImage(pod *unstructured.Unstructured) error {
	return useWorkloadImageAt(pod, "spec")
}

// UseWorkloadImageInJob does what UseWorkloadImage does to the pod
// template of a Job.
func UseWorkloadImageInJob(job *unstructured.Unstructured) error {
	return useWorkloadImageAt(job, "spec", "template", "spec")
}
func useWorkloadImageAt(pod *unstructured.Unstructured, spec ...string) error {
	containers, _, err := unstructured.NestedSlice(pod.Object, append(spec, "containers")...)
	if err != nil {
		return fmt.Errorf("pod %s: %w", pod.GetName(), err)
	}
	for i := range containers {
		c, ok := containers[i].(map[string]any)
		if !ok {
			return fmt.Errorf("pod %s: container %d is not an object", pod.GetName(), i)
		}
		c["image"] = WorkloadImage
		c["imagePullPolicy"] = "Never"
		delete(c, "command")
		delete(c, "args")
	}
	if err := unstructured.SetNestedSlice(pod.Object, containers, append(spec, "containers")...); err != nil {
		return fmt.Errorf("pod %s: %w", pod.GetName(), err)
	}
	if err := unstructured.SetNestedField(pod.Object, true, append(spec, "hostNetwork")...); err != nil {
		return fmt.Errorf("pod %s: %w", pod.GetName(), err)
	}
	return unstructured.SetNestedField(pod.Object, int64(5), append(spec, "terminationGracePeriodSeconds")...)
}
