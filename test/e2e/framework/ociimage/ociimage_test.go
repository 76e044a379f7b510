package ociimage

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework/ociimage/ocitest"
)

func TestWriteTar(t *testing.T) {
	dir := t.TempDir()
	app := filepath.Join(dir, "app")
	conf := filepath.Join(dir, "conf")
	ocitest.WriteFile(t, app, "#!/bin/true\n", 0o700)
	ocitest.WriteFile(t, conf, "key=value\n", 0o600)
	img := Image{
		Name: "localhost/gpuaas/test:e2e",
		Files: []File{
			{Path: "/usr/local/bin/app", Source: app, Mode: 0o755},
			{Path: "/etc/app.conf", Source: conf}, // mode taken from the source
		},
		Entrypoint: []string{"/usr/local/bin/app", "--flag"},
		Env:        []string{"PATH=/usr/local/bin"},
	}
	out := filepath.Join(dir, "image.tar")
	if err := WriteTar(img, out); err != nil {
		t.Fatal(err)
	}
	entries := ocitest.ReadLayout(t, out)

	if got := string(entries["oci-layout"]); got != `{"imageLayoutVersion":"1.0.0"}` {
		t.Errorf("oci-layout = %s", got)
	}
	for name, data := range entries {
		hexDigest, ok := strings.CutPrefix(name, "blobs/sha256/")
		if !ok {
			continue
		}
		if sum := sha256.Sum256(data); hex.EncodeToString(sum[:]) != hexDigest {
			t.Errorf("blob %s has digest %x", name, sum)
		}
	}

	var idx index
	ocitest.Unmarshal(t, entries["index.json"], &idx)
	if idx.SchemaVersion != 2 || idx.MediaType != mediaTypeIndex || len(idx.Manifests) != 1 {
		t.Fatalf("index.json = %+v", idx)
	}
	mDesc := idx.Manifests[0]
	if mDesc.Platform == nil || *mDesc.Platform != (platform{Architecture: "amd64", OS: "linux"}) {
		t.Errorf("manifest platform = %+v, want linux/amd64", mDesc.Platform)
	}
	if got := mDesc.Annotations[annotationImageName]; got != img.Name {
		t.Errorf("image name annotation = %q, want %q", got, img.Name)
	}
	if got := mDesc.Annotations[annotationRefName]; got != "e2e" {
		t.Errorf("ref name annotation = %q, want e2e", got)
	}

	var mf manifest
	ocitest.Unmarshal(t, blobOf(t, entries, mDesc), &mf)
	if mf.SchemaVersion != 2 || mf.MediaType != mediaTypeManifest || mf.Config.MediaType != mediaTypeConfig {
		t.Errorf("manifest = %+v", mf)
	}
	if len(mf.Layers) != 1 || mf.Layers[0].MediaType != mediaTypeLayer {
		t.Fatalf("manifest layers = %+v", mf.Layers)
	}
	var cfg imageConfig
	ocitest.Unmarshal(t, blobOf(t, entries, mf.Config), &cfg)
	layerTar := ocitest.Gunzip(t, blobOf(t, entries, mf.Layers[0]))

	if cfg.Architecture != "amd64" || cfg.OS != "linux" || !cfg.Created.Equal(time.Unix(0, 0)) {
		t.Errorf("config platform/created = %s/%s %v", cfg.OS, cfg.Architecture, cfg.Created)
	}
	if !slices.Equal(cfg.Config.Entrypoint, img.Entrypoint) || !slices.Equal(cfg.Config.Env, img.Env) {
		t.Errorf("config = %+v", cfg.Config)
	}
	sum := sha256.Sum256(layerTar)
	if want := []string{"sha256:" + hex.EncodeToString(sum[:])}; cfg.RootFS.Type != "layers" || !slices.Equal(cfg.RootFS.DiffIDs, want) {
		t.Errorf("rootfs = %+v, want diff_ids %q", cfg.RootFS, want)
	}

	checkLayer(t, layerTar)

	again := filepath.Join(dir, "again.tar")
	if err := WriteTar(img, again); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(ocitest.ReadFile(t, out), ocitest.ReadFile(t, again)) {
		t.Error("two writes of the same image differ")
	}
}

// checkLayer compares the layer's entries, in order, with what the test
// image must contain.
func checkLayer(t *testing.T, layerTar []byte) {
	t.Helper()
	want := []ocitest.Entry{
		{Name: "etc/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "etc/app.conf", Typeflag: tar.TypeReg, Mode: 0o600, Content: "key=value\n"},
		{Name: "tmp/", Typeflag: tar.TypeDir, Mode: 0o1777},
		{Name: "usr/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "usr/local/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "usr/local/bin/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "usr/local/bin/app", Typeflag: tar.TypeReg, Mode: 0o755, Content: "#!/bin/true\n"},
	}
	if got := ocitest.LayerEntries(t, layerTar); !slices.Equal(got, want) {
		t.Errorf("layer entries:\n got %v\nwant %v", got, want)
	}
}

func TestWriteTarRejects(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	ocitest.WriteFile(t, src, "x", 0o644)
	for name, img := range map[string]Image{
		"no name":        {Files: []File{{Path: "/a", Source: src}}},
		"digest ref":     {Name: "x@sha256:00", Files: []File{{Path: "/a", Source: src}}},
		"relative path":  {Name: "x:1", Files: []File{{Path: "a", Source: src}}},
		"unclean path":   {Name: "x:1", Files: []File{{Path: "/a/../b", Source: src}}},
		"duplicate path": {Name: "x:1", Files: []File{{Path: "/a", Source: src}, {Path: "/a", Source: src}}},
		"file is a dir":  {Name: "x:1", Files: []File{{Path: "/a", Source: src}, {Path: "/a/b", Source: src}}},
		"file over tmp":  {Name: "x:1", Files: []File{{Path: "/tmp", Source: src}}},
		"missing source": {Name: "x:1", Files: []File{{Path: "/a", Source: filepath.Join(dir, "nope")}}},
		"dir source":     {Name: "x:1", Files: []File{{Path: "/a", Source: dir}}},
		"root file":      {Name: "x:1", Files: []File{{Path: "/", Source: src}}},
		"file tree":      {Name: "x:1", Layers: []Layer{{{Path: "/", Source: src, Tree: true}}}},
		"missing tree":   {Name: "x:1", Layers: []Layer{{{Path: "/", Source: filepath.Join(dir, "nope"), Tree: true}}}},
		"file in tree":   {Name: "x:1", Layers: []Layer{{{Path: "/", Source: dir, Tree: true}, {Path: "/src", Source: src}}}},
	} {
		out := filepath.Join(dir, "out.tar")
		if err := WriteTar(img, out); err == nil {
			t.Errorf("%s: WriteTar succeeded", name)
		}
		if _, err := os.Stat(out); !os.IsNotExist(err) {
			t.Errorf("%s: output left behind (stat: %v)", name, err)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(dir, ".ociimage-*")); len(left) > 0 {
		t.Errorf("temporary files left behind: %q", left)
	}
}

func TestSplitName(t *testing.T) {
	for ref, want := range map[string][2]string{
		"localhost/gpuaas/gpu-dra-driver:e2e": {"localhost/gpuaas/gpu-dra-driver:e2e", "e2e"},
		"localhost:5000/pause":                {"localhost:5000/pause:latest", "latest"},
		"pause":                               {"pause:latest", "latest"},
	} {
		name, tag, err := splitName(ref)
		if err != nil || name != want[0] || tag != want[1] {
			t.Errorf("splitName(%q) = %q, %q, %v; want %q", ref, name, tag, err, want)
		}
	}
}

func TestStaticBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a binary")
	}
	if runtime.GOOS != "linux" || runtime.GOARCH != "amd64" {
		t.Skip("images are linux/amd64")
	}
	out := filepath.Join(t.TempDir(), "pause")
	if err := StaticBinary(context.Background(), repoRoot(t), "test/images/pause", out, false); err != nil {
		t.Fatal(err)
	}
	f, err := elf.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Error("binary has a PT_INTERP program header: it is dynamically linked")
		}
	}
}

func TestStaticBinaryReportsBuildOutput(t *testing.T) {
	err := StaticBinary(context.Background(), repoRoot(t), "test/images/no-such-package", filepath.Join(t.TempDir(), "x"), false)
	if err == nil || !strings.Contains(err.Error(), "no-such-package") {
		t.Errorf("StaticBinary of a missing package: err = %v, want the go build output", err)
	}
}

// repoRoot is four levels up from this package's directory.
func repoRoot(t *testing.T) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(wd, "..", "..", "..", "..")
}

// blobOf is the blob d describes, which must be d.Size bytes long.
func blobOf(t *testing.T, entries map[string][]byte, d descriptor) []byte {
	t.Helper()
	data := ocitest.Blob(t, entries, d.Digest)
	if int64(len(data)) != d.Size {
		t.Fatalf("blob %s: %d bytes, descriptor says %d", d.Digest, len(data), d.Size)
	}
	return data
}
