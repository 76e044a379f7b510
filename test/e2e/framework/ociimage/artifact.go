package ociimage

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// Artifact is a non-image OCI artifact of one config and one content
// blob, such as a Helm chart: helm push writes the chart's metadata as the
// config and the packaged chart as the one layer, each with a media type
// of Helm's own.
type Artifact struct {
	ConfigMediaType string
	Config          []byte
	LayerMediaType  string
	Layer           []byte
	// Annotations of the manifest. Created is added as
	// org.opencontainers.image.created: helm push dates it with the
	// archive's ctime, so a chart pushed twice got two digests.
	Annotations map[string]string
	Created     time.Time
	// Tag names the manifest in the layout's index.json.
	Tag string
}

// annotationCreated is the OCI annotation of the artifact's creation time.
const annotationCreated = "org.opencontainers.image.created"

// WriteArtifactLayout writes a as an OCI image layout at dir (replaced
// once complete) and returns its manifest's digest, which a registry
// reports once it is pushed: the same artifact gives the same digest.
func WriteArtifactLayout(dir string, a Artifact) (string, error) {
	if a.ConfigMediaType == "" || a.LayerMediaType == "" || a.Tag == "" {
		return "", errors.New("artifact: config and layer media types and a tag are required")
	}
	config, layer := bytesBlob(a.Config), bytesBlob(a.Layer)
	annotations := map[string]string{annotationCreated: a.Created.UTC().Format(time.RFC3339)}
	for k, v := range a.Annotations {
		annotations[k] = v
	}
	mf, err := jsonBlob(manifest{SchemaVersion: 2, MediaType: mediaTypeManifest,
		Config:      descriptor{MediaType: a.ConfigMediaType, Digest: config.digest, Size: config.size},
		Layers:      []descriptor{{MediaType: a.LayerMediaType, Digest: layer.digest, Size: layer.size}},
		Annotations: annotations})
	if err != nil {
		return "", fmt.Errorf("artifact manifest: %w", err)
	}
	top, err := jsonBlob(index{SchemaVersion: 2, MediaType: mediaTypeIndex, Manifests: []descriptor{{
		MediaType: mediaTypeManifest, Digest: mf.digest, Size: mf.size,
		Annotations: map[string]string{annotationRefName: a.Tag},
	}}})
	if err != nil {
		return "", fmt.Errorf("artifact index: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return "", fmt.Errorf("artifact layout: %w", err)
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dir), ".ociimage-artifact-*")
	if err != nil {
		return "", fmt.Errorf("artifact layout: %w", err)
	}
	defer func() { _ = os.RemoveAll(tmp) }()
	blobsDir := filepath.Join(tmp, "blobs", "sha256")
	if err := os.MkdirAll(blobsDir, 0o755); err != nil {
		return "", fmt.Errorf("artifact layout: %w", err)
	}
	for _, b := range []blob{config, layer, mf} {
		if err := writeBlobFile(blobsDir, b); err != nil {
			return "", err
		}
	}
	if err := finishLayout(tmp, dir, top); err != nil {
		return "", fmt.Errorf("artifact layout: %w", err)
	}
	return mf.digest, nil
}

func bytesBlob(data []byte) blob {
	sum := sha256.Sum256(data)
	return blob{digest: "sha256:" + hex.EncodeToString(sum[:]), size: int64(len(data)), data: data}
}
