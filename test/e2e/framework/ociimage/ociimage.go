// Package ociimage builds OCI image layout tarballs without a container tool.
//
// The node e2e tests run a real containerd and kubelet but no Docker or
// buildkit, and the machine cannot pull from a registry. Every image a test
// pod needs (the sandbox "pause" image, the DRA plugin, the GPU workload) is
// therefore a static Go binary that this package wraps into a single-layer
// image, which `ctr -n k8s.io images import` loads and the kubelet then runs
// with imagePullPolicy: Never.
//
// The output is reproducible: the same inputs give the same bytes, so the
// image digest only changes when a binary does and repeated imports are
// no-ops.
//
// The JSON documents are written from small local types rather than
// github.com/opencontainers/image-spec so that this test helper adds no
// module dependency; only the fields containerd reads are emitted.
package ociimage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// Media types and annotation keys of the OCI image spec and containerd.
const (
	mediaTypeIndex    = "application/vnd.oci.image.index.v1+json"
	mediaTypeManifest = "application/vnd.oci.image.manifest.v1+json"
	mediaTypeConfig   = "application/vnd.oci.image.config.v1+json"
	mediaTypeLayer    = "application/vnd.oci.image.layer.v1.tar+gzip"

	// annotationImageName is what containerd's importer names the image
	// after; without it `ctr images import` would need --base-name.
	annotationImageName = "io.containerd.image.name"
	// annotationRefName is the OCI layout's own name for the manifest.
	annotationRefName = "org.opencontainers.image.ref.name"
)

// The images only ever run on the e2e machine; StaticBinary builds for the
// same platform so config and binaries agree.
const (
	imageOS   = "linux"
	imageArch = "amd64"
)

// epoch is every timestamp in the image (tar mtimes, config "created"), fixed
// so that output is reproducible.
var epoch = time.Unix(0, 0).UTC()

// File is one file of the image's single layer.
type File struct {
	// Path is the file's absolute path inside the image, e.g. "/bin/app".
	Path string
	// Source is the host file whose contents are copied.
	Source string
	// Mode holds the permission bits in the image; 0 means those of Source.
	Mode int64
}

// Image describes a single-layer linux/amd64 image.
type Image struct {
	// Name is the image reference containerd registers, e.g.
	// "localhost/gpuaas/gpu-dra-driver:e2e". Without a tag ":latest" is used.
	Name       string
	Files      []File
	Entrypoint []string
	Env        []string // "KEY=value"
}

// descriptor is the OCI content descriptor.
type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Platform    *platform         `json:"platform,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

type platform struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
}

type index struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	Manifests     []descriptor `json:"manifests"`
}

type manifest struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	Config        descriptor   `json:"config"`
	Layers        []descriptor `json:"layers"`
}

type imageConfig struct {
	Created      time.Time       `json:"created"`
	Architecture string          `json:"architecture"`
	OS           string          `json:"os"`
	Config       containerConfig `json:"config"`
	RootFS       rootFS          `json:"rootfs"`
}

// containerConfig uses the capitalised keys of the OCI config schema.
type containerConfig struct {
	Env        []string `json:"Env,omitempty"`
	Entrypoint []string `json:"Entrypoint,omitempty"`
}

type rootFS struct {
	Type    string   `json:"type"`
	DiffIDs []string `json:"diff_ids"`
}

// blob is one entry of blobs/sha256 in the layout.
type blob struct {
	digest string // "sha256:<hex>"
	size   int64
	data   []byte // in-memory content, or nil when path is set
	path   string // file holding the content (the layer)
}

// WriteTar writes img as an OCI image layout tarball to out, replacing any
// existing file only once the new one is complete.
func WriteTar(img Image, out string) error {
	name, tag, err := splitName(img.Name)
	if err != nil {
		return err
	}
	dir := filepath.Dir(out)
	layerFile, err := os.CreateTemp(dir, ".ociimage-layer-*")
	if err != nil {
		return fmt.Errorf("create temporary layer file: %w", err)
	}
	defer func() { _ = os.Remove(layerFile.Name()) }()
	layer, diffID, err := writeLayer(layerFile, img.Files)
	if closeErr := layerFile.Close(); err == nil && closeErr != nil {
		err = fmt.Errorf("close layer file: %w", closeErr)
	}
	if err != nil {
		return fmt.Errorf("image %s: %w", img.Name, err)
	}
	layer.path = layerFile.Name()
	blobs, err := metadataBlobs(img, layer, diffID, name, tag)
	if err != nil {
		return fmt.Errorf("image %s: %w", img.Name, err)
	}
	if err := writeLayout(out, blobs); err != nil {
		return fmt.Errorf("image %s: %w", img.Name, err)
	}
	return nil
}

// splitName returns the full reference (with a tag) and the tag.
func splitName(ref string) (string, string, error) {
	if ref == "" {
		return "", "", errors.New("image name is empty")
	}
	if strings.Contains(ref, "@") {
		return "", "", fmt.Errorf("image name %q: digest references are not supported", ref)
	}
	last := ref[strings.LastIndex(ref, "/")+1:]
	if i := strings.LastIndex(last, ":"); i >= 0 {
		if i == len(last)-1 {
			return "", "", fmt.Errorf("image name %q: empty tag", ref)
		}
		return ref, last[i+1:], nil
	}
	return ref + ":latest", "latest", nil
}

// metadataBlobs builds the config, manifest and index around the layer and
// returns every blob of the layout, with index.json's content first.
func metadataBlobs(img Image, layer blob, diffID, name, tag string) ([]blob, error) {
	config, err := jsonBlob(imageConfig{
		Created:      epoch,
		Architecture: imageArch,
		OS:           imageOS,
		Config:       containerConfig{Env: img.Env, Entrypoint: img.Entrypoint},
		RootFS:       rootFS{Type: "layers", DiffIDs: []string{diffID}},
	})
	if err != nil {
		return nil, fmt.Errorf("image config: %w", err)
	}
	mf, err := jsonBlob(manifest{
		SchemaVersion: 2,
		MediaType:     mediaTypeManifest,
		Config:        descriptor{MediaType: mediaTypeConfig, Digest: config.digest, Size: config.size},
		Layers:        []descriptor{{MediaType: mediaTypeLayer, Digest: layer.digest, Size: layer.size}},
	})
	if err != nil {
		return nil, fmt.Errorf("image manifest: %w", err)
	}
	idx, err := jsonBlob(index{
		SchemaVersion: 2,
		MediaType:     mediaTypeIndex,
		Manifests: []descriptor{{
			MediaType: mediaTypeManifest,
			Digest:    mf.digest,
			Size:      mf.size,
			// containerd's CRI only registers images whose manifest
			// matches the node's platform; without it the import is
			// silently invisible to the kubelet.
			Platform: &platform{Architecture: imageArch, OS: imageOS},
			Annotations: map[string]string{
				annotationImageName: name,
				annotationRefName:   tag,
			},
		}},
	})
	if err != nil {
		return nil, fmt.Errorf("image index: %w", err)
	}
	return []blob{idx, layer, config, mf}, nil
}

func jsonBlob(v any) (blob, error) {
	data, err := json.Marshal(v)
	if err != nil {
		return blob{}, err
	}
	sum := sha256.Sum256(data)
	return blob{digest: "sha256:" + hex.EncodeToString(sum[:]), size: int64(len(data)), data: data}, nil
}

// countingWriter counts what passes through it.
type countingWriter struct{ n int64 }

func (c *countingWriter) Write(p []byte) (int, error) {
	c.n += int64(len(p))
	return len(p), nil
}

// writeLayer writes the gzip-compressed layer tar to w and returns its blob
// (digest and size of the compressed bytes) and its diff ID (digest of the
// uncompressed tar), both computed in one pass.
func writeLayer(w io.Writer, files []File) (blob, string, error) {
	entries, err := layerEntries(files)
	if err != nil {
		return blob{}, "", err
	}
	compressedHash := sha256.New()
	counter := &countingWriter{}
	gz := gzip.NewWriter(io.MultiWriter(w, compressedHash, counter))
	// The zero gzip header (no name, mtime 0) keeps the output reproducible.
	diffHash := sha256.New()
	tw := tar.NewWriter(io.MultiWriter(gz, diffHash))
	for _, e := range entries {
		if err := writeEntry(tw, e); err != nil {
			return blob{}, "", err
		}
	}
	if err := tw.Close(); err != nil {
		return blob{}, "", fmt.Errorf("finish layer tar: %w", err)
	}
	if err := gz.Close(); err != nil {
		return blob{}, "", fmt.Errorf("finish layer gzip: %w", err)
	}
	return blob{digest: digestOf(compressedHash), size: counter.n}, digestOf(diffHash), nil
}

func digestOf(h hash.Hash) string {
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

// layerEntry is a directory (file == nil) or a file of the layer.
type layerEntry struct {
	name string // relative, without a leading slash
	mode int64
	file *File
}

// layerEntries validates files and returns them together with their parent
// directories and /tmp, sorted by name so parents precede children.
func layerEntries(files []File) ([]layerEntry, error) {
	dirs := map[string]int64{"tmp": 0o1777} // programs expect a writable /tmp
	byName := map[string]*File{}
	for i := range files {
		f := &files[i]
		if !path.IsAbs(f.Path) || path.Clean(f.Path) != f.Path || f.Path == "/" {
			return nil, fmt.Errorf("file path %q must be absolute and clean", f.Path)
		}
		name := f.Path[1:]
		if byName[name] != nil {
			return nil, fmt.Errorf("file path %q given twice", f.Path)
		}
		byName[name] = f
		for d := path.Dir(name); d != "."; d = path.Dir(d) {
			if _, ok := dirs[d]; !ok {
				dirs[d] = 0o755
			}
		}
	}
	entries := make([]layerEntry, 0, len(dirs)+len(byName))
	for d, mode := range dirs {
		if byName[d] != nil {
			return nil, fmt.Errorf("file path %q is also a directory of the image", "/"+d)
		}
		entries = append(entries, layerEntry{name: d, mode: mode})
	}
	for name, f := range byName {
		entries = append(entries, layerEntry{name: name, mode: f.Mode, file: f})
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].name < entries[j].name })
	return entries, nil
}

// writeEntry adds one entry, owned by root and dated epoch, to the layer.
func writeEntry(tw *tar.Writer, e layerEntry) error {
	hdr := &tar.Header{Name: e.name, Mode: e.mode, ModTime: epoch, Format: tar.FormatPAX}
	if e.file == nil {
		hdr.Typeflag = tar.TypeDir
		hdr.Name += "/"
		if err := tw.WriteHeader(hdr); err != nil {
			return fmt.Errorf("layer directory /%s: %w", e.name, err)
		}
		return nil
	}
	src, err := os.Open(e.file.Source)
	if err != nil {
		return fmt.Errorf("layer file %s: %w", e.file.Path, err)
	}
	defer func() { _ = src.Close() }()
	info, err := src.Stat()
	if err != nil {
		return fmt.Errorf("layer file %s: %w", e.file.Path, err)
	}
	if !info.Mode().IsRegular() {
		return fmt.Errorf("layer file %s: source %s is not a regular file", e.file.Path, e.file.Source)
	}
	hdr.Typeflag = tar.TypeReg
	hdr.Size = info.Size()
	if hdr.Mode == 0 {
		hdr.Mode = int64(info.Mode().Perm())
	}
	if err := tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("layer file %s: %w", e.file.Path, err)
	}
	// CopyN so a source that grows meanwhile cannot corrupt the tar.
	if _, err := io.CopyN(tw, src, hdr.Size); err != nil {
		return fmt.Errorf("layer file %s: copy %s: %w", e.file.Path, e.file.Source, err)
	}
	return nil
}

// writeLayout writes the OCI layout tarball: oci-layout, index.json (the
// content of blobs[0]) and blobs/sha256/ with the remaining blobs. The file
// appears at out only once complete.
func writeLayout(out string, blobs []blob) (err error) {
	f, err := os.CreateTemp(filepath.Dir(out), ".ociimage-*.tar")
	if err != nil {
		return fmt.Errorf("create image tar: %w", err)
	}
	defer func() {
		if err != nil {
			_ = f.Close()
			_ = os.Remove(f.Name())
		}
	}()
	tw := tar.NewWriter(f)
	if err := writeLayoutEntries(tw, blobs); err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("finish image tar: %w", err)
	}
	if err := f.Chmod(0o644); err != nil {
		return fmt.Errorf("chmod image tar: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close image tar: %w", err)
	}
	if err := os.Rename(f.Name(), out); err != nil {
		return fmt.Errorf("rename image tar: %w", err)
	}
	return nil
}

// writeLayoutEntries writes the layout's entries in a fixed (sorted) order.
func writeLayoutEntries(tw *tar.Writer, blobs []blob) error {
	for _, d := range []string{"blobs/", "blobs/sha256/"} {
		hdr := &tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: 0o755, ModTime: epoch, Format: tar.FormatPAX}
		if err := tw.WriteHeader(hdr); err != nil {
			return fmt.Errorf("image tar %s: %w", d, err)
		}
	}
	sorted := append([]blob(nil), blobs[1:]...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].digest < sorted[j].digest })
	for _, b := range sorted {
		if err := writeBlob(tw, "blobs/sha256/"+strings.TrimPrefix(b.digest, "sha256:"), b); err != nil {
			return err
		}
	}
	if err := writeBlob(tw, "index.json", blobs[0]); err != nil {
		return err
	}
	layout := []byte(`{"imageLayoutVersion":"1.0.0"}`)
	return writeBlob(tw, "oci-layout", blob{size: int64(len(layout)), data: layout})
}

func writeBlob(tw *tar.Writer, name string, b blob) error {
	hdr := &tar.Header{Typeflag: tar.TypeReg, Name: name, Size: b.size, Mode: 0o644, ModTime: epoch, Format: tar.FormatPAX}
	if err := tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("image tar %s: %w", name, err)
	}
	var src io.Reader = bytes.NewReader(b.data)
	if b.path != "" {
		f, err := os.Open(b.path)
		if err != nil {
			return fmt.Errorf("image tar %s: %w", name, err)
		}
		defer func() { _ = f.Close() }()
		src = f
	}
	if _, err := io.CopyN(tw, src, b.size); err != nil {
		return fmt.Errorf("image tar %s: %w", name, err)
	}
	return nil
}

// StaticBinary builds the Go main package pkg (a path relative to repoRoot,
// e.g. "cmd/dra-kubelet-plugin") into a statically linked linux/amd64
// executable at out, so it runs in an image with no libc.
//
// With cgo it links glibc statically: the plugin needs cgo only for go-nvml,
// which dlopen()s libnvidia-ml at run time (never, with the mock NVML
// backend). The linker's warning about dlopen in static binaries is
// expected. The netgo and osusergo tags keep name and user lookups in pure
// Go, because glibc's static getaddrinfo/getpwnam would need NSS libraries
// that the image does not have.
func StaticBinary(ctx context.Context, repoRoot, pkg, out string, cgo bool) error {
	absOut, err := filepath.Abs(out)
	if err != nil {
		return fmt.Errorf("build %s: output path: %w", pkg, err)
	}
	args := []string{"build", "-trimpath"}
	cgoEnabled := "0"
	if cgo {
		cgoEnabled = "1"
		args = append(args, "-tags", "netgo,osusergo",
			"-ldflags", "-linkmode external -extldflags -static")
	}
	args = append(args, "-o", absOut, "./"+strings.TrimPrefix(filepath.ToSlash(pkg), "./"))
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = repoRoot
	cmd.Env = append(os.Environ(),
		"CGO_ENABLED="+cgoEnabled,
		"CGO_CFLAGS=-O2 -g -Wno-deprecated-declarations",
		"GOOS="+imageOS,
		"GOARCH="+imageArch,
	)
	output, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("go %s (CGO_ENABLED=%s): %w\n%s", strings.Join(args, " "), cgoEnabled, err, output)
	}
	return nil
}
