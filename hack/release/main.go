// Command release builds a release of the driver into one directory
// (make release: _output/release), without Docker:
//
//   - image/: the release image for every platform as one multi-architecture
//     image index, an OCI image layout directory (crane push image/ REF), and
//     the same layout as a tarball, <name>-<version>.oci.tar;
//   - the Helm chart packaged with the release's version, appVersion and so
//     default image tag, <chart>-<version>.tgz, and chart/: the OCI artifact
//     helm push would make of it, dated SOURCE_DATE_EPOCH instead of the
//     time of the push, as an OCI image layout (crane push chart/ REF);
//   - an SBOM of the image (CycloneDX JSON: the Go modules of the binaries of
//     every platform, read from their build information, and the Debian
//     packages of every platform's base), <name>-<version>.sbom.cdx.json;
//   - SHA256SUMS of those files.
//
// Every file is dated SOURCE_DATE_EPOCH (the commit's time), owned by root,
// in a fixed order, so the same sources give the same bytes and digests.
//
//	go run ./hack/release --version 0.2.0 --source-date-epoch 1795829197 \
//	    --platform amd64=BASE_ROOTFS,CDI_HOOK,NVML_HOOK --platform arm64=BASE_ROOTFS,CDI_HOOK,NVML_HOOK \
//	    [--repository ghcr.io/gpuaas/gpu-dra-driver] [--out _output/release] [--helm _output/bin/helm]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/gpuaas/gpu-dra-driver/hack/image/release"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// options are the command line's.
type options struct {
	root, version, revision, repository, out, helm, chart string
	created                                               time.Time
	platforms                                             []release.Platform
}

// platformFlags collects --platform ARCH=BASE,HOOK,NVML_HOOK.
type platformFlags []release.Platform

func (p *platformFlags) String() string { return fmt.Sprint(*p) }
func (p *platformFlags) Set(v string) error {
	arch, rest, ok := strings.Cut(v, "=")
	parts := strings.Split(rest, ",")
	if !ok || len(parts) != 3 || arch == "" || slices.Contains(parts, "") {
		return fmt.Errorf("--platform %q: want ARCH=BASE_ROOTFS,CDI_HOOK,NVML_HOOK", v)
	}
	*p = append(*p, release.Platform{Arch: arch, BaseRootfs: parts[0], CDIHook: parts[1], NVMLHook: parts[2]})
	return nil
}

func parseFlags(ctx context.Context) (options, error) {
	o := options{}
	root, err := os.Getwd()
	if err != nil {
		return o, err
	}
	o.root = root
	var epoch int64
	var platforms platformFlags
	flag.StringVar(&o.version, "version", "", "The release's version (hack/version.sh): image tag, chart version and appVersion, what the binaries print.")
	flag.StringVar(&o.revision, "revision", "", "Git commit (default: git rev-parse HEAD, when available).")
	flag.StringVar(&o.repository, "repository", "ghcr.io/gpuaas/gpu-dra-driver", "Image name without the tag.")
	flag.StringVar(&o.out, "out", "_output/release", "Directory of the release's files.")
	flag.StringVar(&o.helm, "helm", "_output/bin/helm", "Helm binary (make helm).")
	flag.StringVar(&o.chart, "chart", "deployments/helm/gpuaas-dra", "The chart's directory.")
	flag.Int64Var(&epoch, "source-date-epoch", -1, "Every file's time, in Unix seconds (the commit's: hack/version.sh --date); default $SOURCE_DATE_EPOCH.")
	flag.Var(&platforms, "platform", "ARCH=BASE_ROOTFS,CDI_HOOK,NVML_HOOK, once per architecture.")
	flag.Parse()
	if flag.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", flag.Args())
	}
	if o.version == "" {
		return o, errors.New("--version is required")
	}
	if len(platforms) == 0 {
		return o, errors.New("at least one --platform is required")
	}
	o.platforms = platforms
	if epoch < 0 {
		if v := os.Getenv("SOURCE_DATE_EPOCH"); v != "" {
			if _, err := fmt.Sscan(v, &epoch); err != nil {
				return o, fmt.Errorf("SOURCE_DATE_EPOCH=%q: %w", v, err)
			}
		} else {
			epoch = 0
		}
	}
	o.created = time.Unix(epoch, 0).UTC()
	if o.revision == "" {
		o.revision = release.GitRevision(ctx, root)
	}
	for _, p := range []*string{&o.out, &o.helm, &o.chart} {
		if *p, err = filepath.Abs(*p); err != nil {
			return o, err
		}
	}
	return o, nil
}

func run(ctx context.Context) error {
	o, err := parseFlags(ctx)
	if err != nil {
		return err
	}
	name := path.Base(o.repository)
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return err
	}
	// A previous release's files (another version) would be taken for
	// this one's.
	for _, pattern := range []string{"*.tgz", "*.oci.tar", "*.sbom.cdx.json", "SHA256SUMS"} {
		old, _ := filepath.Glob(filepath.Join(o.out, pattern))
		for _, f := range old {
			if err := os.Remove(f); err != nil {
				return err
			}
		}
	}
	start := time.Now()
	built, err := release.BuildIndex(ctx, release.IndexOptions{
		Options: release.Options{
			RepoRoot: o.root, Version: o.version, Repository: o.repository, Revision: o.revision,
			Out: filepath.Join(o.out, "image"), WorkDir: filepath.Join(o.out, "bin"), Created: o.created,
		},
		Platforms: o.platforms,
	})
	if err != nil {
		return err
	}
	imageTar := filepath.Join(o.out, name+"-"+o.version+".oci.tar")
	if err := tarDir(built.Dir, imageTar, o.created); err != nil {
		return err
	}
	chart, err := packageChart(ctx, o)
	if err != nil {
		return err
	}
	chartDigest, err := writeChartLayout(chart, filepath.Join(o.out, "chart"), o.version, o.created)
	if err != nil {
		return err
	}
	sbomFile := filepath.Join(o.out, name+"-"+o.version+".sbom.cdx.json")
	counts, err := writeSBOM(sbomFile, o, built)
	if err != nil {
		return err
	}
	sums := filepath.Join(o.out, "SHA256SUMS")
	if err := writeChecksums(sums, o.out, []string{imageTar, chart, sbomFile}); err != nil {
		return err
	}
	return report(o, built, releasedChart{chart, chartDigest}, sbomFile, counts, sums, time.Since(start))
}

// releasedChart is the packaged chart and the digest of its OCI manifest.
type releasedChart struct{ tgz, digest string }

// report prints the release listing.
func report(o options, built release.BuiltIndex, chart releasedChart, sbomFile string, counts map[string]int, sums string, took time.Duration) error {
	rel := func(p string) string {
		if r, err := filepath.Rel(o.root, p); err == nil {
			return r
		}
		return p
	}
	fmt.Printf("release %s (commit %s, SOURCE_DATE_EPOCH %d = %s), built in %s\n",
		o.version, o.revision, o.created.Unix(), o.created.Format(time.RFC3339), took.Round(time.Second))
	fmt.Printf("image:     %s:%s\n", o.repository, o.version)
	fmt.Printf("  index    %s  (%s, OCI layout)\n", built.Digest, rel(built.Dir))
	arches := make([]string, 0, len(built.Manifests))
	for a := range built.Manifests {
		arches = append(arches, a)
	}
	sort.Strings(arches)
	for _, a := range arches {
		fmt.Printf("  linux/%-6s %s\n", a, built.Manifests[a])
	}
	fmt.Printf("chart:     %s\n", rel(chart.tgz))
	fmt.Printf("  oci      %s  (%s, OCI layout: the digest the registry reports once pushed)\n", chart.digest, rel(filepath.Join(o.out, "chart")))
	total := 0
	kinds := make([]string, 0, len(counts))
	for k, n := range counts {
		total += n
		kinds = append(kinds, fmt.Sprintf("%d %s", n, k))
	}
	sort.Strings(kinds)
	fmt.Printf("sbom:      %s (CycloneDX 1.6, %d packages: %s)\n", rel(sbomFile), total, strings.Join(kinds, ", "))
	data, err := os.ReadFile(sums)
	if err != nil {
		return err
	}
	fmt.Printf("checksums: %s\n", rel(sums))
	for _, l := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		fmt.Printf("  %s\n", l)
	}
	return nil
}
