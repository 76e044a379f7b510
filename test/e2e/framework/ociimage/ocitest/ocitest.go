// Package ocitest holds test helpers for reading what package ociimage
// writes: an OCI image layout tarball, its blobs, and its layers' entries.
// The tests of ociimage and of the images built with it (hack/image/release)
// share them. Each helper fails the test on an error.
package ocitest

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"io"
	"os"
	"strings"
	"testing"
	"time"
)

// ReadLayout returns the regular files of the OCI image layout tarball at
// path by name. A layout without oci-layout or index.json fails the test.
func ReadLayout(t testing.TB, path string) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	tr := tar.NewReader(bytes.NewReader(ReadFile(t, path)))
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if hdr.Typeflag != tar.TypeReg {
			continue
		}
		if files[hdr.Name], err = io.ReadAll(tr); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"oci-layout", "index.json"} {
		if files[name] == nil {
			t.Fatalf("layout %s has no %s", path, name)
		}
	}
	return files
}

// Blob returns the blob of a layout read by ReadLayout with the given
// digest ("sha256:<hex>").
func Blob(t testing.TB, layout map[string][]byte, digest string) []byte {
	t.Helper()
	data, ok := layout["blobs/sha256/"+strings.TrimPrefix(digest, "sha256:")]
	if !ok {
		t.Fatalf("no blob %s", digest)
	}
	return data
}

// Entry is what a test checks of one entry of a layer.
type Entry struct {
	Name     string
	Typeflag byte
	Mode     int64
	Content  string
	Linkname string
}

// LayerEntries returns the entries of an uncompressed layer tar in order.
// An entry not owned by root or not dated the Unix epoch (as ociimage
// writes every one) is an error of the test.
func LayerEntries(t testing.TB, layerTar []byte) []Entry {
	t.Helper()
	var got []Entry
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
			t.Errorf("layer entry %s: uid %d gid %d mtime %v, want root's and epoch", hdr.Name, hdr.Uid, hdr.Gid, hdr.ModTime)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, Entry{Name: hdr.Name, Typeflag: hdr.Typeflag, Mode: hdr.Mode, Content: string(data), Linkname: hdr.Linkname})
	}
}

// Gunzip returns the decompressed data (a layer blob).
func Gunzip(t testing.TB, data []byte) []byte {
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

// Unmarshal decodes the JSON document data into v.
func Unmarshal(t testing.TB, data []byte, v any) {
	t.Helper()
	if err := json.Unmarshal(data, v); err != nil {
		t.Fatalf("%s: %v", data, err)
	}
}

// WriteFile writes content to path with exactly mode: the file is chmodded
// after writing, so the umask does not apply.
func WriteFile(t testing.TB, path, content string, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}

// ReadFile returns the contents of the file at path.
func ReadFile(t testing.TB, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}
