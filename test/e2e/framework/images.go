package framework

import (
	"context"
	"fmt"
	"path/filepath"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework/ociimage"
)

// Images of the real node, built from this repository and imported into
// containerd; pods run them with imagePullPolicy: Never.
const (
	// DriverImageRepository:DriverImageTag holds both binaries where the
	// chart runs them (/usr/bin), as the repository's Dockerfile does.
	DriverImageRepository = "localhost/gpuaas/gpu-dra-driver"
	DriverImageTag        = "e2e"
	// WorkloadImage runs test/images/gpuinfo: it prints what the container
	// got from CDI (NVIDIA_* variables, /dev/nvidia* nodes, extra mounts).
	WorkloadImage = "localhost/gpuaas/gpuinfo:e2e"
)

// nodeImage is one image: its name, entrypoint and the commands (static
// binaries) it holds.
type nodeImage struct {
	name       string
	entrypoint string
	binaries   map[string]string // path in the image -> repository package
	cgo        bool
}

var nodeImages = []nodeImage{
	{name: SandboxImage, entrypoint: "/pause", binaries: map[string]string{"/pause": "test/images/pause"}},
	{name: WorkloadImage, entrypoint: "/gpuinfo", binaries: map[string]string{"/gpuinfo": "test/images/gpuinfo"}},
	// go-nvml needs cgo; with the mock NVML it never loads libnvidia-ml, so
	// a static glibc binary needs no other file in the image.
	{name: DriverImageRepository + ":" + DriverImageTag, cgo: true, binaries: map[string]string{
		"/usr/bin/dra-kubelet-plugin": "cmd/dra-kubelet-plugin",
		"/usr/bin/dra-controller":     "cmd/dra-controller",
	}},
}

// BuildNodeImages builds the sandbox, workload and driver images into dir
// as OCI tarballs, for RealNodeOptions.Images.
func BuildNodeImages(ctx context.Context, dir string) ([]string, error) {
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	var tarballs []string
	for i, img := range nodeImages {
		spec := ociimage.Image{Name: img.name}
		if img.entrypoint != "" {
			spec.Entrypoint = []string{img.entrypoint}
		}
		for inImage, pkg := range img.binaries {
			out := filepath.Join(dir, "image-bins", filepath.Base(inImage))
			if err := ociimage.StaticBinary(ctx, root, pkg, out, img.cgo); err != nil {
				return nil, fmt.Errorf("building %s for image %s: %w", pkg, img.name, err)
			}
			spec.Files = append(spec.Files, ociimage.File{Path: inImage, Source: out, Mode: 0o755})
		}
		tarball := filepath.Join(dir, fmt.Sprintf("image-%d.tar", i))
		if err := ociimage.WriteTar(spec, tarball); err != nil {
			return nil, fmt.Errorf("writing image %s: %w", img.name, err)
		}
		tarballs = append(tarballs, tarball)
	}
	return tarballs, nil
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
