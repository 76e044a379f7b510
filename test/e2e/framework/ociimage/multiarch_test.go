package ociimage

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework/ociimage/ocitest"
)

// Issue 40: the release image for amd64 and arm64 is one image index in an
// OCI layout directory, dated SOURCE_DATE_EPOCH, the same bytes every time.
func TestWriteIndexLayout(t *testing.T) {
	dir := t.TempDir()
	app := filepath.Join(dir, "app")
	ocitest.WriteFile(t, app, "#!/bin/true\n", 0o755)
	created := time.Unix(1795829197, 0)
	imgs := []Image{
		{Arch: "arm64", Created: created, Files: []File{{Path: "/app", Source: app}},
			Labels: map[string]string{LabelVersion: "1.2.3"}},
		{Created: created, Files: []File{{Path: "/app", Source: app}}, Labels: map[string]string{LabelVersion: "1.2.3"}},
	}
	out := filepath.Join(dir, "layout")
	got, err := WriteIndexLayout(out, "registry.example/gpuaas/driver:1.2.3", imgs)
	if err != nil {
		t.Fatal(err)
	}
	var top index
	ocitest.Unmarshal(t, ocitest.ReadFile(t, filepath.Join(out, "index.json")), &top)
	if len(top.Manifests) != 1 || top.Manifests[0].MediaType != mediaTypeIndex || top.Manifests[0].Digest != got.Digest ||
		top.Manifests[0].Annotations[annotationRefName] != "1.2.3" {
		t.Fatalf("index.json = %+v, want one image index %s tagged 1.2.3", top, got.Digest)
	}
	blob := func(d string) []byte {
		return ocitest.ReadFile(t, filepath.Join(out, "blobs", "sha256", strings.TrimPrefix(d, "sha256:")))
	}
	var idx imageIndex
	ocitest.Unmarshal(t, blob(got.Digest), &idx)
	if len(idx.Manifests) != 2 || idx.Annotations[LabelVersion] != "1.2.3" {
		t.Fatalf("image index = %+v", idx)
	}
	wantPlatforms := []platform{{Architecture: "amd64", OS: "linux"}, {Architecture: "arm64", OS: "linux", Variant: "v8"}}
	for i, m := range idx.Manifests {
		if *m.Platform != wantPlatforms[i] || got.Manifests[m.Platform.Architecture] != m.Digest {
			t.Errorf("manifest %d: %+v (%v), want platform %+v", i, m, got.Manifests, wantPlatforms[i])
		}
		var mf manifest
		ocitest.Unmarshal(t, blob(m.Digest), &mf)
		var cfg imageConfig
		ocitest.Unmarshal(t, blob(mf.Config.Digest), &cfg)
		if cfg.Architecture != wantPlatforms[i].Architecture || cfg.Variant != wantPlatforms[i].Variant || !cfg.Created.Equal(created) {
			t.Errorf("config %d: %+v", i, cfg)
		}
		tr := tar.NewReader(bytes.NewReader(ocitest.Gunzip(t, blob(mf.Layers[0].Digest))))
		for {
			hdr, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if !hdr.ModTime.Equal(created) || hdr.Uid != 0 || hdr.Gid != 0 {
				t.Errorf("layer entry %s: time %v, owner %d:%d; want %v, 0:0", hdr.Name, hdr.ModTime, hdr.Uid, hdr.Gid, created)
			}
		}
	}
	// The same images again (in the other order): the same digests.
	again, err := WriteIndexLayout(filepath.Join(dir, "again"), "registry.example/gpuaas/driver:1.2.3", []Image{imgs[1], imgs[0]})
	if err != nil {
		t.Fatal(err)
	}
	if again.Digest != got.Digest {
		t.Errorf("a second build has index %s, the first %s", again.Digest, got.Digest)
	}
	if _, err := os.Stat(filepath.Join(out, "oci-layout")); err != nil {
		t.Error(err)
	}
	if _, err := WriteIndexLayout(filepath.Join(dir, "dup"), "x:1", []Image{imgs[1], imgs[1]}); err == nil {
		t.Error("two images of one architecture: no error")
	}
}
