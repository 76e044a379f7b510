package release

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework/ociimage"
)

// Platform is one architecture of a multi-architecture release: the
// runtime base and the nvidia-cdi-hook built for it.
type Platform struct {
	// Arch is the GOARCH: "amd64" or "arm64".
	Arch string
	// BaseRootfs is the base built for Arch (hack/build-image-base.sh with
	// IMAGE_BASE_ARCH).
	BaseRootfs string
	// CDIHook is the static nvidia-cdi-hook built for Arch
	// (hack/build-cdi-hook.sh with CDI_HOOK_ARCH).
	CDIHook string
	// NVMLHook is the dynamically linked nvidia-cdi-hook built for Arch
	// (hack/build-cdi-hook.sh with CDI_HOOK_LINK=dynamic).
	NVMLHook string
}

// IndexOptions says what multi-architecture image to build: o.Out is the
// OCI image layout directory to write, o.WorkDir (required) receives each
// architecture's binaries in <WorkDir>/<arch>/, where they stay (the SBOM
// reads them; qemu-user runs the arm64 ones). o.BaseRootfs, o.CDIHook,
// o.NVMLHook and o.Arch are not used: each platform has its own.
type IndexOptions struct {
	Options
	Platforms []Platform
}

// BuiltIndex is a built multi-architecture image.
type BuiltIndex struct {
	ociimage.IndexLayout
	// Binaries maps each architecture to the image's files built for it
	// (the commands, then nvidia-cdi-hook, static and dynamic).
	Binaries map[string][]ociimage.File
	// Bases maps each architecture to its base root file system.
	Bases map[string]string
}

// BuildIndex builds the release image for every platform and writes them
// as one image index, <Repository>:<Version>, to the layout directory o.Out.
// The same sources, bases, hooks and Created give the same digests.
func BuildIndex(ctx context.Context, o IndexOptions) (BuiltIndex, error) {
	if len(o.Platforms) == 0 {
		return BuiltIndex{}, errors.New("release image index: no platforms")
	}
	if o.WorkDir == "" {
		return BuiltIndex{}, errors.New("release image index: no work directory")
	}
	out := BuiltIndex{Binaries: map[string][]ociimage.File{}, Bases: map[string]string{}}
	imgs := make([]ociimage.Image, 0, len(o.Platforms))
	for _, p := range o.Platforms {
		po := o.Options
		po.Arch, po.BaseRootfs, po.CDIHook, po.NVMLHook = p.Arch, p.BaseRootfs, p.CDIHook, p.NVMLHook
		if err := po.validate(); err != nil {
			return BuiltIndex{}, fmt.Errorf("%s: %w", p.Arch, err)
		}
		dir := filepath.Join(o.WorkDir, p.Arch)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return BuiltIndex{}, fmt.Errorf("release image index: %w", err)
		}
		files, err := BuildBinaries(ctx, po, dir)
		if err != nil {
			return BuiltIndex{}, fmt.Errorf("%s: %w", p.Arch, err)
		}
		out.Binaries[p.Arch] = files
		out.Bases[p.Arch] = p.BaseRootfs
		imgs = append(imgs, Image(po, files))
	}
	layout, err := ociimage.WriteIndexLayout(o.Out, o.Repository+":"+o.Version, imgs)
	if err != nil {
		return BuiltIndex{}, fmt.Errorf("release image index: %w", err)
	}
	out.IndexLayout = layout
	return out, nil
}
