package ociimage

import (
	"archive/tar"
	"bytes"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"

	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework/ociimage/ocitest"
)

// treeImage is a two-layer image: a root file system tree (with symbolic
// links, a hard link, a setuid file and a FIFO), then a file and a second
// tree.
func treeImage(t *testing.T) Image {
	t.Helper()
	dir := t.TempDir()
	root := filepath.Join(dir, "rootfs")
	for _, d := range []string{"etc", "usr/bin", "usr/lib", "root", "tmp"} {
		mkdir(t, filepath.Join(root, d), 0o755)
	}
	chmod(t, filepath.Join(root, "root"), 0o700)
	chmod(t, filepath.Join(root, "tmp"), 0o777|os.ModeSticky)
	ocitest.WriteFile(t, filepath.Join(root, "etc/passwd"), "root:x:0:0::/root:/sbin/nologin\n", 0o644)
	ocitest.WriteFile(t, filepath.Join(root, "usr/bin/su"), "su", 0o755)
	chmod(t, filepath.Join(root, "usr/bin/su"), 0o755|os.ModeSetuid)
	ocitest.WriteFile(t, filepath.Join(root, "usr/lib/libc.so.6"), "libc", 0o755)
	symlink(t, "usr/lib", filepath.Join(root, "lib64"))
	// An absolute target that does not exist on the host: kept verbatim.
	symlink(t, "/usr/share/zoneinfo/UTC", filepath.Join(root, "etc/localtime"))
	if err := os.Link(filepath.Join(root, "etc/passwd"), filepath.Join(root, "etc/passwd-")); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(root, "etc/fifo"), 0o600); err != nil {
		t.Fatal(err)
	}

	data := filepath.Join(dir, "data")
	mkdir(t, data, 0o755)
	mkdir(t, filepath.Join(data, "sub"), 0o750)
	ocitest.WriteFile(t, filepath.Join(data, "sub/a"), "a", 0o600)
	app := filepath.Join(dir, "app")
	ocitest.WriteFile(t, app, "app", 0o700)

	return Image{
		Name: "registry.example/gpuaas/tree:1.2.3",
		Layers: []Layer{
			{{Path: "/", Source: root, Tree: true}},
			{{Path: "/usr/bin/app", Source: app, Mode: 0o755}, {Path: "/opt/data", Source: data, Tree: true}},
		},
		Labels: map[string]string{
			LabelTitle:          "tree",
			LabelVersion:        "1.2.3",
			"com.example.other": "not an annotation",
		},
		User:       "65532:65532",
		WorkingDir: "/opt/data",
		Env:        []string{"PATH=/usr/bin"},
		Entrypoint: []string{"/usr/bin/app"},
		Cmd:        []string{"--help"},
	}
}

func TestWriteTarLayersAndTrees(t *testing.T) {
	img := treeImage(t)
	out := filepath.Join(t.TempDir(), "image.tar")
	if err := WriteTar(img, out); err != nil {
		t.Fatal(err)
	}
	entries := ocitest.ReadLayout(t, out)
	var idx index
	ocitest.Unmarshal(t, entries["index.json"], &idx)
	if len(idx.Manifests) != 1 || idx.Manifests[0].Annotations[annotationImageName] != img.Name ||
		idx.Manifests[0].Annotations[annotationRefName] != "1.2.3" {
		t.Fatalf("index.json = %+v", idx)
	}
	if digest, err := ManifestDigest(out); err != nil || digest != idx.Manifests[0].Digest {
		t.Errorf("ManifestDigest = %q, %v; want %q", digest, err, idx.Manifests[0].Digest)
	}

	var mf manifest
	ocitest.Unmarshal(t, blobOf(t, entries, idx.Manifests[0]), &mf)
	wantAnnotations := map[string]string{LabelTitle: "tree", LabelVersion: "1.2.3"}
	if !maps.Equal(mf.Annotations, wantAnnotations) {
		t.Errorf("manifest annotations = %v, want %v", mf.Annotations, wantAnnotations)
	}
	var cfg imageConfig
	ocitest.Unmarshal(t, blobOf(t, entries, mf.Config), &cfg)
	checkTreeConfig(t, cfg.Config, img)

	if len(mf.Layers) != 2 || len(cfg.RootFS.DiffIDs) != 2 {
		t.Fatalf("manifest has %d layers, config %d diff IDs; want 2", len(mf.Layers), len(cfg.RootFS.DiffIDs))
	}
	checkRootfsLayer(t, ocitest.Gunzip(t, blobOf(t, entries, mf.Layers[0])))
	checkUpperLayer(t, ocitest.Gunzip(t, blobOf(t, entries, mf.Layers[1])))

	again := filepath.Join(t.TempDir(), "again.tar")
	if err := WriteTar(img, again); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(ocitest.ReadFile(t, out), ocitest.ReadFile(t, again)) {
		t.Error("two writes of the same image differ")
	}
}

func checkTreeConfig(t *testing.T, got containerConfig, img Image) {
	t.Helper()
	if got.User != img.User || got.WorkingDir != img.WorkingDir || !maps.Equal(got.Labels, img.Labels) ||
		!slices.Equal(got.Env, img.Env) || !slices.Equal(got.Entrypoint, img.Entrypoint) || !slices.Equal(got.Cmd, img.Cmd) {
		t.Errorf("config = %+v, want that of %+v", got, img)
	}
}

// checkRootfsLayer: the tree's entries with their modes and link targets,
// the hard link as a second regular file, no FIFO and no entry for "/".
func checkRootfsLayer(t *testing.T, layerTar []byte) {
	t.Helper()
	passwd := "root:x:0:0::/root:/sbin/nologin\n"
	want := []ocitest.Entry{
		{Name: "etc/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "etc/localtime", Typeflag: tar.TypeSymlink, Mode: 0o777, Linkname: "/usr/share/zoneinfo/UTC"},
		{Name: "etc/passwd", Typeflag: tar.TypeReg, Mode: 0o644, Content: passwd},
		{Name: "etc/passwd-", Typeflag: tar.TypeReg, Mode: 0o644, Content: passwd},
		{Name: "lib64", Typeflag: tar.TypeSymlink, Mode: 0o777, Linkname: "usr/lib"},
		{Name: "root/", Typeflag: tar.TypeDir, Mode: 0o700},
		{Name: "tmp/", Typeflag: tar.TypeDir, Mode: 0o1777},
		{Name: "usr/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "usr/bin/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "usr/bin/su", Typeflag: tar.TypeReg, Mode: 0o4755, Content: "su"},
		{Name: "usr/lib/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "usr/lib/libc.so.6", Typeflag: tar.TypeReg, Mode: 0o755, Content: "libc"},
	}
	if got := ocitest.LayerEntries(t, layerTar); !slices.Equal(got, want) {
		t.Errorf("rootfs layer entries:\n got %v\nwant %v", got, want)
	}
}

// checkUpperLayer: implied parents, the tree's own root directory, and no
// /tmp (only the bottom layer has the default one).
func checkUpperLayer(t *testing.T, layerTar []byte) {
	t.Helper()
	want := []ocitest.Entry{
		{Name: "opt/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "opt/data/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "opt/data/sub/", Typeflag: tar.TypeDir, Mode: 0o750},
		{Name: "opt/data/sub/a", Typeflag: tar.TypeReg, Mode: 0o600, Content: "a"},
		{Name: "usr/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "usr/bin/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "usr/bin/app", Typeflag: tar.TypeReg, Mode: 0o755, Content: "app"},
	}
	if got := ocitest.LayerEntries(t, layerTar); !slices.Equal(got, want) {
		t.Errorf("upper layer entries:\n got %v\nwant %v", got, want)
	}
}

// TestSameLayerTwice: two layers with the same content are one blob in the
// layout, listed twice in the manifest.
func TestSameLayerTwice(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	ocitest.WriteFile(t, src, "x", 0o644)
	layer := Layer{{Path: "/x", Source: src}}
	out := filepath.Join(dir, "image.tar")
	// The first layer also has /tmp, so the second and third are the same.
	if err := WriteTar(Image{Name: "x:1", Layers: []Layer{layer, layer, layer}}, out); err != nil {
		t.Fatal(err)
	}
	entries := ocitest.ReadLayout(t, out)
	var idx index
	ocitest.Unmarshal(t, entries["index.json"], &idx)
	var mf manifest
	ocitest.Unmarshal(t, blobOf(t, entries, idx.Manifests[0]), &mf)
	if len(mf.Layers) != 3 || mf.Layers[1].Digest != mf.Layers[2].Digest || mf.Layers[0].Digest == mf.Layers[1].Digest {
		t.Errorf("manifest layers = %+v", mf.Layers)
	}
	// index.json, oci-layout, config, manifest and two layer blobs.
	if len(entries) != 6 {
		t.Errorf("layout has %d files, want 6", len(entries))
	}
}

func mkdir(t *testing.T, dir string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(dir, mode); err != nil {
		t.Fatal(err)
	}
	chmod(t, dir, mode)
}

func chmod(t *testing.T, path string, mode os.FileMode) {
	t.Helper()
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}

func symlink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}
