package ociimage

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// IndexLayout is what WriteIndexLayout wrote.
type IndexLayout struct {
	// Dir is the OCI image layout directory.
	Dir string
	// Name is the full reference, with its tag.
	Name string
	// Digest is the multi-platform image index's digest: what a registry
	// reports for Name once pushed, and what a user pins.
	Digest string
	// Manifests maps each architecture to its image manifest's digest.
	Manifests map[string]string
}

// WriteIndexLayout writes imgs, one per architecture, as one multi-platform
// image named name: an OCI image layout directory at dir whose index.json
// holds one entry, an image index (tagged with name's tag) listing each
// image's manifest with its platform. The directory replaces dir only once
// complete. Pushing the layout (crane push DIR REF) pushes the index and
// every image; containerd pulls the one of its node's platform.
//
// The images' own Name is not used; their Labels' OCI annotations (those of
// the first image) also annotate the index.
func WriteIndexLayout(dir, name string, imgs []Image) (IndexLayout, error) {
	ref, tag, err := splitName(name)
	if err != nil {
		return IndexLayout{}, err
	}
	if len(imgs) == 0 {
		return IndexLayout{}, errors.New("image index: no images")
	}
	parent := filepath.Dir(dir)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return IndexLayout{}, fmt.Errorf("image index: %w", err)
	}
	tmp, err := os.MkdirTemp(parent, ".ociimage-layout-*")
	if err != nil {
		return IndexLayout{}, fmt.Errorf("image index: %w", err)
	}
	defer func() { _ = os.RemoveAll(tmp) }()
	blobsDir := filepath.Join(tmp, "blobs", "sha256")
	if err := os.MkdirAll(blobsDir, 0o755); err != nil {
		return IndexLayout{}, fmt.Errorf("image index: %w", err)
	}
	out := IndexLayout{Dir: dir, Name: ref, Manifests: map[string]string{}}
	manifests := make([]descriptor, 0, len(imgs))
	for _, img := range imgs {
		p := img.platform()
		if _, dup := out.Manifests[p.Architecture]; dup {
			return IndexLayout{}, fmt.Errorf("image index: two images for %s", p.Architecture)
		}
		mf, err := writeImageBlobs(tmp, blobsDir, img)
		if err != nil {
			return IndexLayout{}, fmt.Errorf("image index %s (%s): %w", ref, p.Architecture, err)
		}
		out.Manifests[p.Architecture] = mf.digest
		manifests = append(manifests, descriptor{MediaType: mediaTypeManifest, Digest: mf.digest, Size: mf.size, Platform: p})
	}
	// Sorted by platform, so the index does not depend on the order of imgs.
	sort.Slice(manifests, func(i, j int) bool {
		return manifests[i].Platform.Architecture < manifests[j].Platform.Architecture
	})
	idx, err := jsonBlob(imageIndex{SchemaVersion: 2, MediaType: mediaTypeIndex, Manifests: manifests,
		Annotations: ociAnnotations(imgs[0].Labels)})
	if err != nil {
		return IndexLayout{}, fmt.Errorf("image index: %w", err)
	}
	if err := writeBlobFile(blobsDir, idx); err != nil {
		return IndexLayout{}, err
	}
	out.Digest = idx.digest
	top, err := jsonBlob(index{SchemaVersion: 2, MediaType: mediaTypeIndex, Manifests: []descriptor{{
		MediaType: mediaTypeIndex, Digest: idx.digest, Size: idx.size,
		Annotations: map[string]string{annotationImageName: ref, annotationRefName: tag},
	}}})
	if err != nil {
		return IndexLayout{}, fmt.Errorf("image index: %w", err)
	}
	if err := finishLayout(tmp, dir, top); err != nil {
		return IndexLayout{}, fmt.Errorf("image index: %w", err)
	}
	return out, nil
}

// finishLayout writes the layout files of tmp (its index.json, top, and
// oci-layout) and puts tmp in dir's place.
func finishLayout(tmp, dir string, top blob) error {
	if err := os.WriteFile(filepath.Join(tmp, "index.json"), top.data, 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(tmp, "oci-layout"), []byte(`{"imageLayoutVersion":"1.0.0"}`), 0o644); err != nil {
		return err
	}
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	return os.Rename(tmp, dir)
}

// imageIndex is an OCI image index with annotations (index.json has none).
type imageIndex struct {
	SchemaVersion int               `json:"schemaVersion"`
	MediaType     string            `json:"mediaType"`
	Manifests     []descriptor      `json:"manifests"`
	Annotations   map[string]string `json:"annotations,omitempty"`
}

// writeImageBlobs writes one image's layers, config and manifest into
// blobsDir and returns its manifest.
func writeImageBlobs(tmp, blobsDir string, img Image) (blob, error) {
	layers, diffIDs, cleanup, err := writeLayers(tmp, img.allLayers(), img.created())
	defer cleanup()
	if err != nil {
		return blob{}, err
	}
	for _, l := range layers {
		if err := os.Rename(l.path, filepath.Join(blobsDir, strings.TrimPrefix(l.digest, "sha256:"))); err != nil {
			return blob{}, fmt.Errorf("layer blob: %w", err)
		}
		if err := os.Chmod(filepath.Join(blobsDir, strings.TrimPrefix(l.digest, "sha256:")), 0o644); err != nil {
			return blob{}, fmt.Errorf("layer blob: %w", err)
		}
	}
	config, mf, err := manifestBlobs(img, layers, diffIDs)
	if err != nil {
		return blob{}, err
	}
	for _, b := range []blob{config, mf} {
		if err := writeBlobFile(blobsDir, b); err != nil {
			return blob{}, err
		}
	}
	return mf, nil
}

func writeBlobFile(blobsDir string, b blob) error {
	if err := os.WriteFile(filepath.Join(blobsDir, strings.TrimPrefix(b.digest, "sha256:")), b.data, 0o644); err != nil {
		return fmt.Errorf("blob %s: %w", b.digest, err)
	}
	return nil
}
