package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework/ociimage"
)

// Helm's media types for a chart in an OCI registry (helm.sh/helm/v3
// pkg/registry): the chart's metadata as the config, the packaged chart
// as the one layer.
const (
	helmConfigMediaType = "application/vnd.cncf.helm.config.v1+json"
	helmChartMediaType  = "application/vnd.cncf.helm.chart.content.v1.tar+gzip"
)

// writeChartLayout writes the packaged chart as the OCI artifact helm push
// would make of it, into an OCI layout at dir, and returns the manifest's
// digest. helm push dates the manifest (org.opencontainers.image.created)
// with the archive file's ctime, which no one can set, so the chart's
// digest changed with every push; here it is the release's
// SOURCE_DATE_EPOCH, and hack/release-push.sh pushes the layout as it is.
func writeChartLayout(chartTgz, dir, tag string, created time.Time) (string, error) {
	data, err := os.ReadFile(chartTgz)
	if err != nil {
		return "", err
	}
	meta, err := chartMetadata(data)
	if err != nil {
		return "", fmt.Errorf("%s: %w", chartTgz, err)
	}
	config, err := yaml.YAMLToJSON(meta)
	if err != nil {
		return "", fmt.Errorf("%s: Chart.yaml: %w", chartTgz, err)
	}
	var m struct{ Name, Version, Description string }
	if err := yaml.Unmarshal(meta, &m); err != nil {
		return "", fmt.Errorf("%s: Chart.yaml: %w", chartTgz, err)
	}
	if m.Name == "" || m.Version == "" {
		return "", fmt.Errorf("%s: Chart.yaml without name and version", chartTgz)
	}
	return ociimage.WriteArtifactLayout(dir, ociimage.Artifact{
		ConfigMediaType: helmConfigMediaType, Config: config,
		LayerMediaType: helmChartMediaType, Layer: data,
		// The annotations helm push sets from the chart.
		Annotations: map[string]string{
			ociimage.LabelTitle: m.Name, ociimage.LabelVersion: m.Version, ociimage.LabelDescription: m.Description,
		},
		Created: created, Tag: tag,
	})
}

// chartMetadata is the Chart.yaml at the top of a packaged chart
// (<name>/Chart.yaml).
func chartMetadata(tgz []byte) ([]byte, error) {
	gz, err := gzip.NewReader(bytes.NewReader(tgz))
	if err != nil {
		return nil, err
	}
	tr := tar.NewReader(gz)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil, errors.New("no Chart.yaml in the archive")
		}
		if err != nil {
			return nil, err
		}
		if dir, file := path.Split(hdr.Name); file == "Chart.yaml" && path.Clean(dir) != "." && path.Dir(path.Clean(dir)) == "." {
			return io.ReadAll(tr)
		}
	}
}
