package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// helm package dates a chart's entries with the time of packaging; the
// release rewrites them so that two builds give the same archive.
func TestNormalizeTgzIsReproducible(t *testing.T) {
	dir := t.TempDir()
	mtime := time.Unix(1795829197, 0)
	var outs [][]byte
	for i, packaged := range []time.Time{time.Now(), time.Now().Add(time.Hour)} {
		in := filepath.Join(dir, "in.tgz")
		writeTgz(t, in, packaged, map[string]string{"chart/Chart.yaml": "name: chart\n", "chart/values.yaml": "a: 1\n"})
		out := filepath.Join(dir, "out"+string(rune('0'+i))+".tgz")
		if err := normalizeTgz(in, out, mtime); err != nil {
			t.Fatal(err)
		}
		data, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		outs = append(outs, data)
	}
	if !bytes.Equal(outs[0], outs[1]) {
		t.Fatal("two packagings an hour apart give different archives")
	}
	gz, err := gzip.NewReader(bytes.NewReader(outs[0]))
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(gz)
	var names []string
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if !hdr.ModTime.Equal(mtime) || hdr.Uid != 0 || hdr.Uname != "" {
			t.Errorf("%s: time %v, owner %d %q; want %v, root", hdr.Name, hdr.ModTime, hdr.Uid, hdr.Uname, mtime)
		}
		names = append(names, hdr.Name)
	}
	if got := strings.Join(names, " "); got != "chart/Chart.yaml chart/values.yaml" {
		t.Errorf("entries %q: the order of helm's archive is kept", got)
	}
}

func writeTgz(t *testing.T, path string, mtime time.Time, files map[string]string) {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	zw.ModTime = mtime
	tw := tar.NewWriter(zw)
	for _, name := range slices.Sorted(maps.Keys(files)) {
		body := files[name]
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(body)), ModTime: mtime, Uid: 1000, Uname: "builder"}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// The base's package records are Debian control paragraphs.
func TestControlFields(t *testing.T) {
	p := filepath.Join(t.TempDir(), "libc6")
	control := "Package: libc6\nSource: glibc\nVersion: 2.36-9+deb12u14\nArchitecture: arm64\nDescription: GNU C Library\n shared libraries\n"
	if err := os.WriteFile(p, []byte(control), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := controlFields(p)
	if err != nil {
		t.Fatal(err)
	}
	if f["Package"] != "libc6" || f["Version"] != "2.36-9+deb12u14" || f["Architecture"] != "arm64" || f["Source"] != "glibc" || f["Description"] != "GNU C Library" {
		t.Errorf("fields = %v", f)
	}
}

func TestRequiredVersion(t *testing.T) {
	root := t.TempDir()
	gomod := "module x\n\nrequire (\n\tgithub.com/NVIDIA/nvidia-container-toolkit v1.20.1\n\tgithub.com/a/b v0.1.0 // indirect\n)\n\nrequire github.com/c/d v2.0.0\n"
	if err := os.WriteFile(filepath.Join(root, "go.mod"), []byte(gomod), 0o644); err != nil {
		t.Fatal(err)
	}
	for mod, want := range map[string]string{"github.com/NVIDIA/nvidia-container-toolkit": "v1.20.1", "github.com/a/b": "v0.1.0",
		"github.com/c/d": "v2.0.0", "github.com/e/f": "unknown"} {
		if got := requiredVersion(root, mod); got != want {
			t.Errorf("requiredVersion(%s) = %s, want %s", mod, got, want)
		}
	}
}

// helm push dated the chart's OCI manifest with the archive's ctime, so
// the chart got a new digest at every push. The release writes the
// artifact itself, dated SOURCE_DATE_EPOCH: the same chart gives the same
// digest, with helm's media types and annotations.
func TestChartLayoutIsReproducible(t *testing.T) {
	dir := t.TempDir()
	created := time.Unix(1795829197, 0)
	tgz := filepath.Join(dir, "gpuaas-dra-1.2.3.tgz")
	writeTgz(t, tgz, created, map[string]string{
		"gpuaas-dra/Chart.yaml":  "apiVersion: v2\nname: gpuaas-dra\nversion: 1.2.3\ndescription: GPUs as a service\n",
		"gpuaas-dra/values.yaml": "a: 1\n",
	})
	var digests []string
	for i := range 2 {
		out := filepath.Join(dir, "chart"+string(rune('0'+i)))
		d, err := writeChartLayout(tgz, out, "1.2.3", created)
		if err != nil {
			t.Fatal(err)
		}
		digests = append(digests, d)
	}
	if digests[0] != digests[1] || !strings.HasPrefix(digests[0], "sha256:") {
		t.Fatalf("two writes of one chart: digests %v, want one", digests)
	}
	var mf struct {
		Config      struct{ MediaType, Digest string }
		Layers      []struct{ MediaType string }
		Annotations map[string]string
	}
	readBlobJSON(t, filepath.Join(dir, "chart0"), digests[0], &mf)
	if mf.Config.MediaType != helmConfigMediaType || len(mf.Layers) != 1 || mf.Layers[0].MediaType != helmChartMediaType {
		t.Errorf("manifest %+v: want helm's config and chart media types", mf)
	}
	for k, want := range map[string]string{
		"org.opencontainers.image.created": "2026-11-28T01:26:37Z", "org.opencontainers.image.title": "gpuaas-dra",
		"org.opencontainers.image.version": "1.2.3",
	} {
		if got := mf.Annotations[k]; got != want {
			t.Errorf("annotation %s = %q, want %q", k, got, want)
		}
	}
	var config map[string]any
	readBlobJSON(t, filepath.Join(dir, "chart0"), mf.Config.Digest, &config)
	if config["name"] != "gpuaas-dra" || config["version"] != "1.2.3" {
		t.Errorf("config %v: want the Chart.yaml's metadata", config)
	}
	// A chart of another time is another artifact.
	if d, err := writeChartLayout(tgz, filepath.Join(dir, "later"), "1.2.3", created.Add(time.Second)); err != nil || d == digests[0] {
		t.Errorf("a second later: digest %s (%v), want another", d, err)
	}
}

func readBlobJSON(t *testing.T, layout, digest string, v any) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(layout, "blobs", "sha256", strings.TrimPrefix(digest, "sha256:")))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, v); err != nil {
		t.Fatal(err)
	}
}
