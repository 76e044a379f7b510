// Package ociimage builds OCI image layout tarballs without a container tool.
//
// Neither the node e2e tests nor the release build have Docker or buildkit,
// and the machines cannot pull from a registry. The images (the sandbox
// "pause" image, the GPU workload, the driver's release image) are therefore
// written here from host files and directory trees: the tarball is an OCI
// image layout (oci-layout, index.json, blobs/sha256/...), which
// `ctr -n k8s.io images import` loads and which skopeo's oci-archive
// transport copies to a registry.
//
// The output is reproducible: the same inputs give the same bytes (every
// timestamp is the Unix epoch, every owner root, every list sorted), so the
// image digest only changes when a file does and repeated imports are
// no-ops.
//
// The JSON documents are written from small local types rather than
// github.com/opencontainers/image-spec so that this package adds no module
// dependency; only the fields containerd and skopeo read are emitted.
package ociimage

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
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

// Label keys of the OCI image spec's pre-defined annotations, for
// Image.Labels. There is deliberately no "created": a wall-clock time would
// make every build's digest different.
const (
	LabelTitle       = "org.opencontainers.image.title"
	LabelDescription = "org.opencontainers.image.description"
	LabelSource      = "org.opencontainers.image.source"
	LabelVersion     = "org.opencontainers.image.version"
	LabelRevision    = "org.opencontainers.image.revision"
	LabelLicenses    = "org.opencontainers.image.licenses"

	// ociAnnotationPrefix marks the labels that are also manifest
	// annotations, where registries and skopeo inspect look for them.
	ociAnnotationPrefix = "org.opencontainers.image."
)

// The images run on linux; the architecture is amd64 unless Image.Arch
// says otherwise (the release image is also built for arm64). StaticBinary
// and DynamicBinary build for amd64, *ForArch for another, so that config
// and binaries agree.
const (
	imageOS   = "linux"
	imageArch = "amd64"
)

// epoch is every timestamp in the image (tar mtimes, config "created"), fixed
// so that output is reproducible.
var epoch = time.Unix(0, 0).UTC()

// Image describes a linux image, amd64 unless Arch says otherwise.
type Image struct {
	// Arch is the GOARCH the image is for ("amd64", "arm64"); empty means
	// amd64.
	Arch string
	// Created is the image's time: the config's "created" and every file's
	// modification time in its layers. The zero time means the Unix epoch.
	// A release sets it to SOURCE_DATE_EPOCH (its commit's time), which
	// keeps the build reproducible and dates the image as its sources.
	Created time.Time
	// Name is the image reference containerd registers, e.g.
	// "localhost/gpuaas/gpu-dra-driver:e2e". Without a tag ":latest" is used.
	Name string
	// Layers are the image's layers, bottom first.
	Layers []Layer
	// Files is one more layer on top of Layers: the whole image for the
	// single-layer images of the e2e tests.
	Files []File
	// Labels go into the image config; those with the
	// "org.opencontainers.image." prefix (the Label* keys) also become
	// annotations of the manifest.
	Labels     map[string]string
	User       string // "uid:gid" or a name in the image's /etc/passwd
	WorkingDir string
	Env        []string // "KEY=value"
	Entrypoint []string
	Cmd        []string
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
	Variant      string `json:"variant,omitempty"`
}

type index struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	Manifests     []descriptor `json:"manifests"`
}

type manifest struct {
	SchemaVersion int               `json:"schemaVersion"`
	MediaType     string            `json:"mediaType"`
	Config        descriptor        `json:"config"`
	Layers        []descriptor      `json:"layers"`
	Annotations   map[string]string `json:"annotations,omitempty"`
}

type imageConfig struct {
	Created      time.Time       `json:"created"`
	Architecture string          `json:"architecture"`
	OS           string          `json:"os"`
	Variant      string          `json:"variant,omitempty"`
	Config       containerConfig `json:"config"`
	RootFS       rootFS          `json:"rootfs"`
}

// containerConfig uses the capitalised keys of the OCI config schema. Every
// field is omitted when empty so that images without them keep the bytes
// (and digests) they had before the fields existed.
type containerConfig struct {
	User       string            `json:"User,omitempty"`
	Env        []string          `json:"Env,omitempty"`
	Entrypoint []string          `json:"Entrypoint,omitempty"`
	Cmd        []string          `json:"Cmd,omitempty"`
	WorkingDir string            `json:"WorkingDir,omitempty"`
	Labels     map[string]string `json:"Labels,omitempty"`
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
	path   string // file holding the content (a layer)
}

// WriteTar writes img as an OCI image layout tarball to out, replacing any
// existing file only once the new one is complete.
func WriteTar(img Image, out string) error {
	name, tag, err := splitName(img.Name)
	if err != nil {
		return err
	}
	layers, diffIDs, cleanup, err := writeLayers(filepath.Dir(out), img.allLayers(), img.created())
	defer cleanup()
	if err != nil {
		return fmt.Errorf("image %s: %w", img.Name, err)
	}
	blobs, err := metadataBlobs(img, layers, diffIDs, name, tag)
	if err != nil {
		return fmt.Errorf("image %s: %w", img.Name, err)
	}
	if err := writeLayout(out, blobs); err != nil {
		return fmt.Errorf("image %s: %w", img.Name, err)
	}
	return nil
}

// allLayers returns Layers followed by Files as a layer of its own. An
// image with neither still gets one layer (holding /tmp), as it always had.
func (img Image) allLayers() []Layer {
	layers := append([]Layer(nil), img.Layers...)
	if len(img.Files) > 0 || len(layers) == 0 {
		layers = append(layers, Layer(img.Files))
	}
	return layers
}

// writeLayers writes each layer to a temporary file in dir and returns their
// blobs and diff IDs, bottom first. cleanup removes the files; it is to be
// called even when err is set.
func writeLayers(dir string, layers []Layer, mtime time.Time) (blobs []blob, diffIDs []string, cleanup func(), err error) {
	var paths []string
	cleanup = func() {
		for _, p := range paths {
			_ = os.Remove(p)
		}
	}
	for i, l := range layers {
		f, err := os.CreateTemp(dir, ".ociimage-layer-*")
		if err != nil {
			return nil, nil, cleanup, fmt.Errorf("create temporary layer file: %w", err)
		}
		paths = append(paths, f.Name())
		// Only the first layer gets the default /tmp: it is a property of
		// the image, and an upper layer must not override the base's.
		b, diffID, err := writeLayer(f, l, i == 0, mtime)
		if closeErr := f.Close(); err == nil && closeErr != nil {
			err = fmt.Errorf("close layer file: %w", closeErr)
		}
		if err != nil {
			return nil, nil, cleanup, fmt.Errorf("layer %d: %w", i+1, err)
		}
		b.path = f.Name()
		blobs = append(blobs, b)
		diffIDs = append(diffIDs, diffID)
	}
	return blobs, diffIDs, cleanup, nil
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

// metadataBlobs builds the config, manifest and index around the layers and
// returns every blob of the layout, with index.json's content first.
func metadataBlobs(img Image, layers []blob, diffIDs []string, name, tag string) ([]blob, error) {
	config, mf, err := manifestBlobs(img, layers, diffIDs)
	if err != nil {
		return nil, err
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
			Platform: img.platform(),
			Annotations: map[string]string{
				annotationImageName: name,
				annotationRefName:   tag,
			},
		}},
	})
	if err != nil {
		return nil, fmt.Errorf("image index: %w", err)
	}
	return append([]blob{idx, config, mf}, layers...), nil
}

// manifestBlobs returns the image's config and manifest.
func manifestBlobs(img Image, layers []blob, diffIDs []string) (config, mf blob, err error) {
	p := img.platform()
	config, err = jsonBlob(imageConfig{
		Created:      img.created(),
		Architecture: p.Architecture,
		OS:           p.OS,
		Variant:      p.Variant,
		Config: containerConfig{
			User:       img.User,
			Env:        img.Env,
			Entrypoint: img.Entrypoint,
			Cmd:        img.Cmd,
			WorkingDir: img.WorkingDir,
			Labels:     img.Labels,
		},
		RootFS: rootFS{Type: "layers", DiffIDs: diffIDs},
	})
	if err != nil {
		return blob{}, blob{}, fmt.Errorf("image config: %w", err)
	}
	mf, err = jsonBlob(manifest{
		SchemaVersion: 2,
		MediaType:     mediaTypeManifest,
		Config:        descriptor{MediaType: mediaTypeConfig, Digest: config.digest, Size: config.size},
		Layers:        layerDescriptors(layers),
		Annotations:   ociAnnotations(img.Labels),
	})
	if err != nil {
		return blob{}, blob{}, fmt.Errorf("image manifest: %w", err)
	}
	return config, mf, nil
}

// platform is the image's OS and architecture; arm64 images carry the
// variant v8, as registries and containerd's platform matcher expect.
func (img Image) platform() *platform {
	p := &platform{Architecture: img.Arch, OS: imageOS}
	if p.Architecture == "" {
		p.Architecture = imageArch
	}
	if p.Architecture == "arm64" {
		p.Variant = "v8"
	}
	return p
}

// created is the image's time, the Unix epoch unless Created is set.
func (img Image) created() time.Time {
	if img.Created.IsZero() {
		return epoch
	}
	return img.Created.UTC()
}

func layerDescriptors(layers []blob) []descriptor {
	ds := make([]descriptor, 0, len(layers))
	for _, l := range layers {
		ds = append(ds, descriptor{MediaType: mediaTypeLayer, Digest: l.digest, Size: l.size})
	}
	return ds
}

// ociAnnotations returns the labels in the OCI annotation namespace, or nil.
func ociAnnotations(labels map[string]string) map[string]string {
	var out map[string]string
	for k, v := range labels {
		if strings.HasPrefix(k, ociAnnotationPrefix) {
			if out == nil {
				out = map[string]string{}
			}
			out[k] = v
		}
	}
	return out
}

func jsonBlob(v any) (blob, error) {
	data, err := json.Marshal(v)
	if err != nil {
		return blob{}, err
	}
	return bytesBlob(data), nil
}

// ManifestDigest returns the digest ("sha256:<hex>") of the one manifest in
// the index.json of an image layout tarball: the digest a registry reports
// for the image once pushed, which does not depend on the tarball's layout.
func ManifestDigest(tarball string) (string, error) {
	f, err := os.Open(tarball)
	if err != nil {
		return "", fmt.Errorf("read image tarball: %w", err)
	}
	defer func() { _ = f.Close() }()
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return "", fmt.Errorf("image tarball %s has no index.json", tarball)
		}
		if err != nil {
			return "", fmt.Errorf("read image tarball %s: %w", tarball, err)
		}
		if path := strings.TrimPrefix(hdr.Name, "./"); path == "index.json" {
			return indexManifestDigest(tr, tarball)
		}
	}
}

func indexManifestDigest(r io.Reader, tarball string) (string, error) {
	var idx index
	if err := json.NewDecoder(r).Decode(&idx); err != nil {
		return "", fmt.Errorf("image tarball %s: index.json: %w", tarball, err)
	}
	if len(idx.Manifests) != 1 {
		return "", fmt.Errorf("image tarball %s: index.json has %d manifests, want 1", tarball, len(idx.Manifests))
	}
	return idx.Manifests[0].Digest, nil
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
// Two layers with the same content are one blob, written once.
func writeLayoutEntries(tw *tar.Writer, blobs []blob) error {
	for _, d := range []string{"blobs/", "blobs/sha256/"} {
		hdr := &tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: 0o755, ModTime: epoch, Format: tar.FormatPAX}
		if err := tw.WriteHeader(hdr); err != nil {
			return fmt.Errorf("image tar %s: %w", d, err)
		}
	}
	sorted := append([]blob(nil), blobs[1:]...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].digest < sorted[j].digest })
	for i, b := range sorted {
		if i > 0 && b.digest == sorted[i-1].digest {
			continue
		}
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
