// Command image builds the driver's release image without Docker: the two
// binaries (dynamic cgo, version stamped) and nvidia-cdi-hook on the
// runtime base of `make image-base`, written as an OCI image layout tarball
// (see package release). It prints the tarball, its size, the manifest
// digest and how to push or import it.
//
//	go run ./hack/image --version 0.1.0 [--repository ghcr.io/gpuaas/gpu-dra-driver]
//	    [--base-rootfs _output/image-base/rootfs] [--cdi-hook _output/bin/nvidia-cdi-hook]
//	    [--nvml-hook _output/bin/nvml-hook/nvidia-cdi-hook]
//	    [--out _output/image/gpu-dra-driver-0.1.0.tar] [--revision <commit>]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path"
	"path/filepath"
	"syscall"

	"github.com/gpuaas/gpu-dra-driver/hack/image/release"
	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework/ociimage"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	root, err := repoRoot()
	if err != nil {
		return err
	}
	o, err := parseFlags(ctx, root)
	if err != nil {
		return err
	}
	out, err := release.Build(ctx, o)
	if err != nil {
		return err
	}
	return report(o, out)
}

// parseFlags returns the build's options. Default paths are those the make
// targets write, under root; paths given on the command line are taken
// relative to the working directory, as usual.
func parseFlags(ctx context.Context, root string) (release.Options, error) {
	o := release.Options{RepoRoot: root}
	flag.StringVar(&o.Version, "version", "dev", "Image tag, and the version the binaries print.")
	flag.StringVar(&o.Repository, "repository", "ghcr.io/gpuaas/gpu-dra-driver", "Image name without the tag.")
	flag.StringVar(&o.BaseRootfs, "base-rootfs", filepath.Join(root, "_output/image-base/rootfs"), "Runtime base root file system (make image-base).")
	flag.StringVar(&o.CDIHook, "cdi-hook", filepath.Join(root, "_output/bin/nvidia-cdi-hook"), "Static nvidia-cdi-hook binary (make cdi-hook).")
	flag.StringVar(&o.NVMLHook, "nvml-hook", filepath.Join(root, "_output/bin/nvml-hook/nvidia-cdi-hook"), "Dynamically linked nvidia-cdi-hook binary (make cdi-hook).")
	flag.StringVar(&o.Out, "out", "", "Tarball to write (default _output/image/<name>-<version>.tar).")
	flag.StringVar(&o.Revision, "revision", "", "Git commit for the revision label (default: git rev-parse HEAD, when available).")
	flag.Parse()
	if flag.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", flag.Args())
	}
	if o.Out == "" {
		o.Out = filepath.Join(root, "_output", "images", path.Base(o.Repository)+"-"+o.Version+".oci.tar")
	}
	if o.Revision == "" {
		o.Revision = release.GitRevision(ctx, root)
	}
	return o, nil
}

// repoRoot is the nearest directory at or above the working directory that
// has go.mod, so the command works from anywhere in the repository.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("finding the repository root: %w", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("finding the repository root: no go.mod at or above the working directory")
		}
		dir = parent
	}
}

// report prints what was built and how to use it. The tarball is an OCI
// layout archive, which skopeo's oci-archive transport reads as it is.
func report(o release.Options, out string) error {
	info, err := os.Stat(out)
	if err != nil {
		return fmt.Errorf("release image: %w", err)
	}
	digest, err := ociimage.ManifestDigest(out)
	if err != nil {
		return err
	}
	ref := o.Repository + ":" + o.Version
	fmt.Printf("image:    %s\n", ref)
	fmt.Printf("tarball:  %s (%.1f MiB, %d bytes)\n", out, float64(info.Size())/(1<<20), info.Size())
	fmt.Printf("manifest: %s\n", digest)
	fmt.Printf("push:     skopeo copy oci-archive:%s docker://%s\n", out, ref)
	fmt.Printf("import:   ctr -n k8s.io images import %s\n", out)
	return nil
}
