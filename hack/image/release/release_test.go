package release

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"debug/elf"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
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

// TestBuild builds the real binaries (the one slow step) onto a tiny base
// and checks the image: names, labels, user, entrypoint, both layers, and
// that the binaries are dynamic and print the version.
func TestBuild(t *testing.T) {
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
	blobs := readLayout(t, out)
	var idx index
	unmarshal(t, blobs["index.json"], &idx)
	if len(idx.Manifests) != 1 || idx.Manifests[0].Annotations["io.containerd.image.name"] != "registry.example/gpuaas/driver:1.2.3-test" {
		t.Fatalf("index.json = %s", blobs["index.json"])
	}
	var mf manifest
	unmarshal(t, blob(t, blobs, idx.Manifests[0].Digest), &mf)
	var cfg imageConfig
	unmarshal(t, blob(t, blobs, mf.Config.Digest), &cfg)
	checkConfig(t, cfg, mf)
	if len(mf.Layers) != 2 {
		t.Fatalf("manifest has %d layers, want 2", len(mf.Layers))
	}
	checkBaseLayer(t, gunzip(t, blob(t, blobs, mf.Layers[0].Digest)))
	checkBinaryLayer(t, gunzip(t, blob(t, blobs, mf.Layers[1].Digest)), o)
	for _, b := range binaries {
		checkBinary(t, filepath.Join(o.WorkDir, filepath.Base(b.path)), o.Version)
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
	writeFile(t, filepath.Join(base, "etc/passwd"), "nonroot:x:65532:65532::/home/nonroot:/sbin/nologin\n", 0o644)
	if err := os.Symlink("usr/lib", filepath.Join(base, "lib")); err != nil {
		t.Fatal(err)
	}
	hook := filepath.Join(dir, "nvidia-cdi-hook")
	writeFile(t, hook, "#!/bin/true\n", 0o700)
	return Options{
		RepoRoot:   filepath.Join("..", "..", ".."),
		Version:    "1.2.3-test",
		Repository: "registry.example/gpuaas/driver",
		Revision:   "0123456789abcdef",
		BaseRootfs: base,
		CDIHook:    hook,
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
	want := []string{"usr/ d 755", "usr/bin/ d 755", "usr/bin/dra-controller - 755", "usr/bin/dra-kubelet-plugin - 755", "usr/bin/nvidia-cdi-hook - 755"}
	if got := layerEntries(t, layerTar, contents); !slices.Equal(got, want) {
		t.Errorf("binary layer:\n got %q\nwant %q", got, want)
	}
	if hook := mustRead(t, o.CDIHook); !bytes.Equal(contents["usr/bin/nvidia-cdi-hook"], hook) {
		t.Error("the image's nvidia-cdi-hook is not the given one")
	}
	for _, b := range binaries {
		built := mustRead(t, filepath.Join(o.WorkDir, filepath.Base(b.path)))
		if !bytes.Equal(contents[strings.TrimPrefix(b.path, "/")], built) {
			t.Errorf("the image's %s is not the built one", b.path)
		}
	}
}

// checkBinary: dynamically linked (it has an ELF interpreter), and
// --version prints the version.
func checkBinary(t *testing.T, bin, version string) {
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
	if got := strings.TrimSpace(string(out)); got != version {
		t.Errorf("%s --version printed %q, want %q", bin, got, version)
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

// readLayout returns the regular files of the layout tarball by name.
func readLayout(t *testing.T, tarball string) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	tr := tar.NewReader(bytes.NewReader(mustRead(t, tarball)))
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if hdr.Typeflag == tar.TypeReg {
			files[hdr.Name] = data
		}
	}
	for _, name := range []string{"oci-layout", "index.json"} {
		if files[name] == nil {
			t.Fatalf("layout has no %s", name)
		}
	}
	return files
}

// layerEntries describes each entry of a layer as "name type mode [link]"
// and puts the regular files' contents into contents, when not nil.
func layerEntries(t *testing.T, layerTar []byte, contents map[string][]byte) []string {
	t.Helper()
	var got []string
	tr := tar.NewReader(bytes.NewReader(layerTar))
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return got
		}
		if err != nil {
			t.Fatal(err)
		}
		if hdr.Uid != 0 || hdr.Gid != 0 {
			t.Errorf("%s is owned by %d:%d, want root", hdr.Name, hdr.Uid, hdr.Gid)
		}
		typ := map[byte]string{tar.TypeDir: "d", tar.TypeReg: "-", tar.TypeSymlink: "l"}[hdr.Typeflag]
		got = append(got, strings.TrimSpace(strings.Join([]string{hdr.Name, typ, strconv.FormatInt(hdr.Mode, 8), hdr.Linkname}, " ")))
		if contents != nil && hdr.Typeflag == tar.TypeReg {
			if contents[hdr.Name], err = io.ReadAll(tr); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func blob(t *testing.T, blobs map[string][]byte, digest string) []byte {
	t.Helper()
	data, ok := blobs["blobs/sha256/"+strings.TrimPrefix(digest, "sha256:")]
	if !ok {
		t.Fatalf("no blob %s", digest)
	}
	return data
}

func gunzip(t *testing.T, data []byte) []byte {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	out, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func unmarshal(t *testing.T, data []byte, v any) {
	t.Helper()
	if err := json.Unmarshal(data, v); err != nil {
		t.Fatalf("%s: %v", data, err)
	}
}

func writeFile(t *testing.T, path, content string, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}
