package ociimage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestWriteTar(t *testing.T) {
	dir := t.TempDir()
	app := filepath.Join(dir, "app")
	conf := filepath.Join(dir, "conf")
	writeFile(t, app, "#!/bin/true\n", 0o700)
	writeFile(t, conf, "key=value\n", 0o600)
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
	entries := readTar(t, mustRead(t, out))

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
	unmarshal(t, entries["index.json"], &idx)
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
	unmarshal(t, blobOf(t, entries, mDesc), &mf)
	if mf.SchemaVersion != 2 || mf.MediaType != mediaTypeManifest || mf.Config.MediaType != mediaTypeConfig {
		t.Errorf("manifest = %+v", mf)
	}
	if len(mf.Layers) != 1 || mf.Layers[0].MediaType != mediaTypeLayer {
		t.Fatalf("manifest layers = %+v", mf.Layers)
	}
	var cfg imageConfig
	unmarshal(t, blobOf(t, entries, mf.Config), &cfg)
	layerTar := gunzip(t, blobOf(t, entries, mf.Layers[0]))

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
	if !bytes.Equal(mustRead(t, out), mustRead(t, again)) {
		t.Error("two writes of the same image differ")
	}
}

// checkLayer compares the layer's entries, in order, with what the test
// image must contain.
func checkLayer(t *testing.T, layerTar []byte) {
	t.Helper()
	want := []tarEntry{
		{"etc/", tar.TypeDir, 0o755, "", ""},
		{"etc/app.conf", tar.TypeReg, 0o600, "key=value\n", ""},
		{"tmp/", tar.TypeDir, 0o1777, "", ""},
		{"usr/", tar.TypeDir, 0o755, "", ""},
		{"usr/local/", tar.TypeDir, 0o755, "", ""},
		{"usr/local/bin/", tar.TypeDir, 0o755, "", ""},
		{"usr/local/bin/app", tar.TypeReg, 0o755, "#!/bin/true\n", ""},
	}
	if got := readLayerEntries(t, layerTar); !slices.Equal(got, want) {
		t.Errorf("layer entries:\n got %v\nwant %v", got, want)
	}
}

// tarEntry is what a test checks of one entry of a layer.
type tarEntry struct {
	name     string
	typeflag byte
	mode     int64
	content  string
	linkname string
}

// readLayerEntries returns the entries of an uncompressed layer tar in
// order, checking that each is owned by root and dated epoch.
func readLayerEntries(t *testing.T, layerTar []byte) []tarEntry {
	t.Helper()
	var got []tarEntry
	tr := tar.NewReader(bytes.NewReader(layerTar))
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return got
		}
		if err != nil {
			t.Fatal(err)
		}
		if hdr.Uid != 0 || hdr.Gid != 0 || !hdr.ModTime.Equal(time.Unix(0, 0)) {
			t.Errorf("layer entry %s: uid %d gid %d mtime %v", hdr.Name, hdr.Uid, hdr.Gid, hdr.ModTime)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, tarEntry{hdr.Name, hdr.Typeflag, hdr.Mode, string(data), hdr.Linkname})
	}
}

func TestWriteTarRejects(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	writeFile(t, src, "x", 0o644)
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

func blobOf(t *testing.T, entries map[string][]byte, d descriptor) []byte {
	t.Helper()
	data, ok := entries["blobs/sha256/"+strings.TrimPrefix(d.Digest, "sha256:")]
	if !ok {
		t.Fatalf("no blob for %s", d.Digest)
	}
	if int64(len(data)) != d.Size {
		t.Fatalf("blob %s: %d bytes, descriptor says %d", d.Digest, len(data), d.Size)
	}
	return data
}

// readTar returns the regular files of a tar by name.
func readTar(t *testing.T, data []byte) map[string][]byte {
	t.Helper()
	entries := map[string][]byte{}
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return entries
		}
		if err != nil {
			t.Fatal(err)
		}
		if hdr.Typeflag != tar.TypeReg {
			continue
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		entries[hdr.Name] = b
	}
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
	if err := os.Chmod(path, mode); err != nil { // not subject to umask
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
