package release

import (
	"archive/tar"
	"bytes"
	"context"
	"debug/elf"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/gpuaas/gpu-dra-driver/pkg/cdi"
	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework/ociimage/ocitest"
)

// The parts of the layout's documents the tests read.
type (
	descriptor struct {
		Digest      string            `json:"digest"`
		Annotations map[string]string `json:"annotations"`
	}
	index struct {
		Manifests []descriptor `json:"manifests"`
	}
	manifest struct {
		Config      descriptor        `json:"config"`
		Layers      []descriptor      `json:"layers"`
		Annotations map[string]string `json:"annotations"`
	}
	imageConfig struct {
		Config struct {
			User       string
			Entrypoint []string
			Labels     map[string]string
		} `json:"config"`
	}
)

// TestBuildReleaseImage builds the real binaries (the one slow step) onto a tiny base
// and checks the image: names, labels, user, entrypoint, both layers, and
// that the binaries are dynamic and print the version.
func TestBuildReleaseImage(t *testing.T) {
	if testing.Short() {
		t.Skip("builds both cgo binaries")
	}
	if runtime.GOOS != "linux" || runtime.GOARCH != "amd64" {
		t.Skip("the image is linux/amd64")
	}
	o := testOptions(t)
	out, err := Build(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if out != o.Out {
		t.Errorf("Build returned %q, want %q", out, o.Out)
	}
	blobs := ocitest.ReadLayout(t, out)
	var idx index
	ocitest.Unmarshal(t, blobs["index.json"], &idx)
	if len(idx.Manifests) != 1 || idx.Manifests[0].Annotations["io.containerd.image.name"] != "registry.example/gpuaas/driver:1.2.3-test" {
		t.Fatalf("index.json = %s", blobs["index.json"])
	}
	var mf manifest
	ocitest.Unmarshal(t, ocitest.Blob(t, blobs, idx.Manifests[0].Digest), &mf)
	var cfg imageConfig
	ocitest.Unmarshal(t, ocitest.Blob(t, blobs, mf.Config.Digest), &cfg)
	checkConfig(t, cfg, mf)
	if len(mf.Layers) != 2 {
		t.Fatalf("manifest has %d layers, want 2", len(mf.Layers))
	}
	checkBaseLayer(t, ocitest.Gunzip(t, ocitest.Blob(t, blobs, mf.Layers[0].Digest)))
	checkBinaryLayer(t, ocitest.Gunzip(t, ocitest.Blob(t, blobs, mf.Layers[1].Digest)), o)
	for _, b := range binaries {
		checkBinary(t, filepath.Join(o.WorkDir, filepath.Base(b.path)), o.Version, o.Revision)
	}
}

// testOptions: a base with /etc/passwd, /tmp and a symbolic link, and a
// stand-in hook, in a temporary directory.
func testOptions(t *testing.T) Options {
	t.Helper()
	dir := t.TempDir()
	base := filepath.Join(dir, "rootfs")
	for _, d := range []string{"etc", "usr/lib"} {
		if err := os.MkdirAll(filepath.Join(base, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	ocitest.WriteFile(t, filepath.Join(base, "etc/passwd"), "nonroot:x:65532:65532::/home/nonroot:/sbin/nologin\n", 0o644)
	if err := os.Symlink("usr/lib", filepath.Join(base, "lib")); err != nil {
		t.Fatal(err)
	}
	hook := filepath.Join(dir, "nvidia-cdi-hook")
	ocitest.WriteFile(t, hook, "#!/bin/true\n", 0o700)
	nvmlHook := filepath.Join(dir, "nvml-hook")
	ocitest.WriteFile(t, nvmlHook, "#!/bin/true dynamic\n", 0o700)
	return Options{
		RepoRoot:   filepath.Join("..", "..", ".."),
		Version:    "1.2.3-test",
		Repository: "registry.example/gpuaas/driver",
		Revision:   "0123456789abcdef",
		BaseRootfs: base,
		CDIHook:    hook,
		NVMLHook:   nvmlHook,
		Out:        filepath.Join(dir, "out", "image.tar"),
		WorkDir:    filepath.Join(dir, "work"),
	}
}

func checkConfig(t *testing.T, cfg imageConfig, mf manifest) {
	t.Helper()
	wantLabels := map[string]string{
		"org.opencontainers.image.title":       "gpuaas-dra",
		"org.opencontainers.image.description": "DRA driver for NVIDIA GPUs (gpu.gpuaas.io)",
		"org.opencontainers.image.source":      "https://github.com/gpuaas/gpu-dra-driver",
		"org.opencontainers.image.version":     "1.2.3-test",
		"org.opencontainers.image.revision":    "0123456789abcdef",
		"org.opencontainers.image.licenses":    "Apache-2.0",
	}
	if !maps.Equal(cfg.Config.Labels, wantLabels) {
		t.Errorf("labels = %v, want %v", cfg.Config.Labels, wantLabels)
	}
	if !maps.Equal(mf.Annotations, wantLabels) {
		t.Errorf("manifest annotations = %v, want %v", mf.Annotations, wantLabels)
	}
	if cfg.Config.User != "65532:65532" || !slices.Equal(cfg.Config.Entrypoint, []string{"/usr/bin/dra-controller"}) {
		t.Errorf("user %q, entrypoint %q", cfg.Config.User, cfg.Config.Entrypoint)
	}
}

// checkBaseLayer: the base tree as it is, with the default /tmp.
func checkBaseLayer(t *testing.T, layerTar []byte) {
	t.Helper()
	want := []string{"etc/ d 755", "etc/passwd - 644", "lib l 777 usr/lib", "tmp/ d 1777", "usr/ d 755", "usr/lib/ d 755"}
	if got := layerEntries(t, layerTar, nil); !slices.Equal(got, want) {
		t.Errorf("base layer:\n got %q\nwant %q", got, want)
	}
}

// checkBinaryLayer: the three commands, executable by all.
func checkBinaryLayer(t *testing.T, layerTar []byte, o Options) {
	t.Helper()
	contents := map[string][]byte{}
	want := []string{"usr/ d 755", "usr/bin/ d 755", "usr/bin/dra-controller - 755", "usr/bin/dra-kubelet-plugin - 755", "usr/bin/nvidia-cdi-hook - 755",
		"usr/lib/ d 755", "usr/lib/gpuaas/ d 755", "usr/lib/gpuaas/nvml-hook/ d 755", "usr/lib/gpuaas/nvml-hook/nvidia-cdi-hook - 755"}
	if got := layerEntries(t, layerTar, contents); !slices.Equal(got, want) {
		t.Errorf("binary layer:\n got %q\nwant %q", got, want)
	}
	if hook := ocitest.ReadFile(t, o.CDIHook); !bytes.Equal(contents["usr/bin/nvidia-cdi-hook"], hook) {
		t.Error("the image's nvidia-cdi-hook is not the given one")
	}
	// Where the plugin installs the NVML hook from by default.
	if hook := ocitest.ReadFile(t, o.NVMLHook); !bytes.Equal(contents[strings.TrimPrefix(cdi.DefaultNVMLHookSource, "/")], hook) {
		t.Errorf("the image's %s is not the given dynamically linked hook", cdi.DefaultNVMLHookSource)
	}
	for _, b := range binaries {
		built := ocitest.ReadFile(t, filepath.Join(o.WorkDir, filepath.Base(b.path)))
		if !bytes.Equal(contents[strings.TrimPrefix(b.path, "/")], built) {
			t.Errorf("the image's %s is not the built one", b.path)
		}
	}
}

// checkBinary: dynamically linked (it has an ELF interpreter), and
// --version prints the version.
func checkBinary(t *testing.T, bin, version, revision string) {
	t.Helper()
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	if !slices.ContainsFunc(f.Progs, func(p *elf.Prog) bool { return p.Type == elf.PT_INTERP }) {
		t.Errorf("%s has no PT_INTERP program header: it is not dynamically linked", bin)
	}
	out, err := exec.Command(bin, "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("%s --version: %v\n%s", bin, err, out)
	}
	want := filepath.Base(bin) + " " + version + " (commit " + revision + ", go"
	if got := strings.TrimSpace(string(out)); !strings.HasPrefix(got, want) {
		t.Errorf("%s --version printed %q, want %q...", bin, got, want)
	}
}

// A missing input fails before anything is built, naming the make target
// that builds it.
func TestBuildRejects(t *testing.T) {
	for name, tc := range map[string]struct {
		change func(*Options)
		want   string
	}{
		"no base":        {func(o *Options) { o.BaseRootfs = filepath.Join(o.BaseRootfs, "nope") }, "make image-base"},
		"base is a file": {func(o *Options) { o.BaseRootfs = o.CDIHook }, "make image-base"},
		"no hook":        {func(o *Options) { o.CDIHook = "" }, "make cdi-hook"},
		"hook is a dir":  {func(o *Options) { o.CDIHook = o.BaseRootfs }, "make cdi-hook"},
		"no NVML hook":   {func(o *Options) { o.NVMLHook = "" }, "make cdi-hook"},
		"bad version":    {func(o *Options) { o.Version = "1.0 beta" }, "not a valid image tag"},
		"tagged repo":    {func(o *Options) { o.Repository += ":x" }, "without tag"},
		"digest repo":    {func(o *Options) { o.Repository += "@sha256:00" }, "without tag"},
	} {
		o := testOptions(t)
		tc.change(&o)
		_, err := Build(context.Background(), o)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want one with %q", name, err, tc.want)
		}
		if _, statErr := os.Stat(o.WorkDir); !os.IsNotExist(statErr) {
			t.Errorf("%s: work directory created (stat: %v): something was built", name, statErr)
		}
	}
}

func TestValidRepository(t *testing.T) {
	for r, want := range map[string]bool{
		"ghcr.io/gpuaas/gpu-dra-driver":     true,
		"localhost:5000/gpuaas/driver":      true,
		"driver":                            true,
		"":                                  false,
		"ghcr.io/gpuaas/":                   false,
		"ghcr.io/gpuaas/driver:1":           false,
		"ghcr.io/gpuaas/driver@sha256:0000": false,
		"ghcr.io/gpu aas/driver":            false,
	} {
		if got := validRepository(r); got != want {
			t.Errorf("validRepository(%q) = %v, want %v", r, got, want)
		}
	}
}

// layerEntries describes each entry of a layer as "name type mode [link]"
// and puts the regular files' contents into contents, when not nil.
func layerEntries(t *testing.T, layerTar []byte, contents map[string][]byte) []string {
	t.Helper()
	var got []string
	for _, e := range ocitest.LayerEntries(t, layerTar) {
		typ := map[byte]string{tar.TypeDir: "d", tar.TypeReg: "-", tar.TypeSymlink: "l"}[e.Typeflag]
		got = append(got, strings.TrimSpace(strings.Join([]string{e.Name, typ, strconv.FormatInt(e.Mode, 8), e.Linkname}, " ")))
		if contents != nil && e.Typeflag == tar.TypeReg {
			contents[e.Name] = []byte(e.Content)
		}
	}
	return got
}
