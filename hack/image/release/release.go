// Package release builds the driver's release image without a container
// tool: one OCI image layout tarball holding both binaries of the
// gpu.gpuaas.io DRA driver, /usr/bin/dra-kubelet-plugin (DaemonSet) and
// /usr/bin/dra-controller (Deployment), plus nvidia-cdi-hook, on a runtime
// base of Debian packages (glibc, /etc/passwd).
//
// The binaries are ordinary dynamically linked cgo executables: go-nvml
// dlopen()s libnvidia-ml.so.1 from the driver root at run time, which a
// static glibc binary cannot do, so the image must carry glibc. The output
// is reproducible (see package ociimage): the same sources, base and hook
// give the same manifest digest.
package release

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/gpuaas/gpu-dra-driver/pkg/version"
	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework/ociimage"
)

// What the image is, for its labels.
const (
	title       = "gpuaas-dra"
	description = "DRA driver for NVIDIA GPUs (gpu.gpuaas.io)"
	source      = "https://github.com/gpuaas/gpu-dra-driver"
	licenses    = "Apache-2.0"

	// versionVar and commitVar are what both binaries print with --version.
	versionVar = version.Package + ".version"
	commitVar  = version.Package + ".commit"

	// nonroot is the uid:gid the controller runs as; the base's
	// /etc/passwd names it, as distroless's does. The kubelet plugin's
	// pod asks for the privileges it needs.
	nonroot = "65532:65532"
	// DefaultPath is the image's PATH, set because nothing else would (the
	// image config is where runtimes take it from); the e2e workload image,
	// on the same base, uses it too.
	DefaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
)

// Paths in the image. The Helm chart runs both commands from /usr/bin, and
// the controller is the entrypoint (the chart runs the plugin with its own command).
const (
	pluginPath     = "/usr/bin/dra-kubelet-plugin"
	controllerPath = "/usr/bin/dra-controller"
	cdiHookPath    = "/usr/bin/nvidia-cdi-hook"
	// nvmlHookPath is the dynamically linked nvidia-cdi-hook, which the
	// plugin installs on the host with the base's loader and glibc to set
	// memory limits (pkg/cdi's DefaultNVMLHookSource).
	nvmlHookPath = "/usr/lib/gpuaas/nvml-hook/nvidia-cdi-hook"
)

// binaries are the commands built from this repository: the package and
// its path in the image.
var binaries = []struct{ pkg, path string }{
	{"cmd/dra-kubelet-plugin", pluginPath},
	{"cmd/dra-controller", controllerPath},
}

// tagPattern is the syntax of a registry tag (the OCI distribution spec).
var tagPattern = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$`)

// Options says what to build and where.
type Options struct {
	// RepoRoot is the repository's root directory, where go build runs.
	RepoRoot string
	// Version is the image tag and what the binaries print with --version.
	Version string
	// Repository is the image name without a tag, e.g.
	// "ghcr.io/gpuaas/gpu-dra-driver".
	Repository string
	// Revision is the git commit built, for the revision label; optional.
	Revision string
	// BaseRootfs is the runtime base's root directory (make image-base
	// writes _output/image-base/rootfs).
	BaseRootfs string
	// CDIHook is a built static nvidia-cdi-hook (make cdi-hook writes
	// _output/bin/nvidia-cdi-hook).
	CDIHook string
	// NVMLHook is a built dynamically linked nvidia-cdi-hook (make
	// cdi-hook writes _output/bin/nvml-hook/nvidia-cdi-hook).
	NVMLHook string
	// Out is the tarball to write; its directory is created if needed.
	Out string
	// WorkDir receives the built binaries; empty means a temporary
	// directory, removed afterwards.
	WorkDir string
	// Created dates the image and every file in it (SOURCE_DATE_EPOCH);
	// zero means the Unix epoch.
	Created time.Time
	// Arch is the image's architecture, amd64 when empty; Build builds
	// the binaries for it (cgo with a cross compiler for arm64).
	Arch string
}

// Build builds the binaries and writes the image <Repository>:<Version> to
// o.Out, which it returns.
func Build(ctx context.Context, o Options) (string, error) {
	if err := o.validate(); err != nil {
		return "", err
	}
	workDir, cleanup, err := workDir(o.WorkDir)
	if err != nil {
		return "", err
	}
	defer cleanup()
	built, err := BuildBinaries(ctx, o, workDir)
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(filepath.Dir(o.Out), 0o755); err != nil {
		return "", fmt.Errorf("release image: output directory: %w", err)
	}
	if err := ociimage.WriteTar(Image(o, built), o.Out); err != nil {
		return "", fmt.Errorf("release image: %w", err)
	}
	return o.Out, nil
}

// validate checks the options before anything is built, so that a missing
// input costs no compile.
func (o Options) validate() error {
	switch {
	case o.RepoRoot == "":
		return errors.New("release image: no repository root")
	case !tagPattern.MatchString(o.Version):
		return fmt.Errorf("release image: version %q is not a valid image tag", o.Version)
	case !validRepository(o.Repository):
		return fmt.Errorf("release image: repository %q must be a name without tag or digest", o.Repository)
	case o.Out == "":
		return errors.New("release image: no output path")
	}
	if err := checkInput(o.BaseRootfs, fs.ModeDir, "base root file system", "make image-base"); err != nil {
		return err
	}
	if err := checkInput(o.CDIHook, 0, "nvidia-cdi-hook", "make cdi-hook"); err != nil {
		return err
	}
	return checkInput(o.NVMLHook, 0, "dynamically linked nvidia-cdi-hook", "make cdi-hook")
}

// validRepository accepts a repository name without tag or digest; a
// registry host may have a port ("localhost:5000/gpuaas/driver").
func validRepository(r string) bool {
	last := r[strings.LastIndex(r, "/")+1:]
	return last != "" && !strings.ContainsAny(r, "@ \t\n") && !strings.Contains(last, ":")
}

// checkInput fails unless p is of type (fs.ModeDir, or 0 for a regular
// file), naming the make target that builds it: a missing input is a
// step not yet run, not a bug.
func checkInput(p string, typ fs.FileMode, what, target string) error {
	if p == "" {
		return fmt.Errorf("release image: no %s given (%s builds it)", what, target)
	}
	info, err := os.Stat(p)
	if err != nil {
		return fmt.Errorf("release image: %s: %w (%s builds it)", what, err, target)
	}
	if info.Mode().Type() != typ {
		want := "regular file"
		if typ == fs.ModeDir {
			want = "directory"
		}
		return fmt.Errorf("release image: %s %s is not a %s (%s builds it)", what, p, want, target)
	}
	return nil
}

// workDir returns dir, or a new temporary directory and its removal.
func workDir(dir string) (string, func(), error) {
	if dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return "", nil, fmt.Errorf("release image: work directory: %w", err)
		}
		return dir, func() {}, nil
	}
	tmp, err := os.MkdirTemp("", "gpuaas-release-")
	if err != nil {
		return "", nil, fmt.Errorf("release image: work directory: %w", err)
	}
	return tmp, func() { _ = os.RemoveAll(tmp) }, nil
}

// BuildBinaries builds the commands into workDir for o.Arch with the
// version and commit stamped, and returns the image's files.
func BuildBinaries(ctx context.Context, o Options, workDir string) ([]ociimage.File, error) {
	vars := map[string]string{versionVar: o.Version}
	if o.Revision != "" {
		vars[commitVar] = o.Revision
	}
	files := make([]ociimage.File, 0, len(binaries)+2)
	for _, b := range binaries {
		out := filepath.Join(workDir, filepath.Base(b.path))
		if err := ociimage.DynamicBinaryForArch(ctx, o.RepoRoot, b.pkg, out, o.arch(), vars); err != nil {
			return nil, fmt.Errorf("release image: %w", err)
		}
		files = append(files, ociimage.File{Path: b.path, Source: out, Mode: 0o755})
	}
	return append(files, ociimage.File{Path: cdiHookPath, Source: o.CDIHook, Mode: 0o755},
		ociimage.File{Path: nvmlHookPath, Source: o.NVMLHook, Mode: 0o755}), nil
}

// arch is the image's architecture.
func (o Options) arch() string {
	if o.Arch == "" {
		return "amd64"
	}
	return o.Arch
}

// Image is the release image: the base, then the three commands.
func Image(o Options, files []ociimage.File) ociimage.Image {
	labels := map[string]string{
		ociimage.LabelTitle:       title,
		ociimage.LabelDescription: description,
		ociimage.LabelSource:      source,
		ociimage.LabelVersion:     o.Version,
		ociimage.LabelLicenses:    licenses,
	}
	if o.Revision != "" {
		labels[ociimage.LabelRevision] = o.Revision
	}
	return ociimage.Image{
		Name:    o.Repository + ":" + o.Version,
		Arch:    o.Arch,
		Created: o.Created,
		Layers: []ociimage.Layer{
			{{Path: "/", Source: o.BaseRootfs, Tree: true}},
			ociimage.Layer(files),
		},
		Labels:     labels,
		User:       nonroot,
		Env:        []string{DefaultPath},
		Entrypoint: []string{controllerPath},
	}
}

// GitRevision returns the commit checked out in root, or "" outside a git
// work tree (e.g. a source tarball): the label is optional.
func GitRevision(ctx context.Context, root string) string {
	cmd := exec.CommandContext(ctx, "git", "rev-parse", "HEAD")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}
