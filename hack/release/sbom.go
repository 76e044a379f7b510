package main

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"debug/buildinfo"
	"fmt"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	cdx "github.com/CycloneDX/cyclonedx-go"

	"github.com/gpuaas/gpu-dra-driver/hack/image/release"
)

// writeSBOM writes the image's SBOM as CycloneDX 1.6 JSON, made with the
// CycloneDX project's Go library: the image (the index) is the subject;
// its components are the Go modules (and Go's standard library) linked
// into every binary of every platform, read from the build information the
// go command embeds in each binary, and the Debian packages of every
// platform's base, read from the control files the base keeps in
// /var/lib/dpkg/status.d (as distroless's). It returns the count of
// components by purl type.
func writeSBOM(out string, o options, built release.BuiltIndex) (map[string]int, error) {
	comps := map[string]*cdx.Component{}
	users := map[string]map[string]bool{} // bom-ref -> the binaries that link it
	arches := make([]string, 0, len(built.Binaries))
	for a := range built.Binaries {
		arches = append(arches, a)
	}
	sort.Strings(arches)
	for _, arch := range arches {
		for _, f := range built.Binaries[arch] {
			if err := addGoModules(comps, users, o, arch, f.Path, f.Source); err != nil {
				return nil, err
			}
		}
		if err := addDebianPackages(comps, built.Bases[arch]); err != nil {
			return nil, err
		}
	}
	refs := make([]string, 0, len(comps))
	for r := range comps {
		refs = append(refs, r)
	}
	sort.Strings(refs)
	list := make([]cdx.Component, 0, len(refs))
	counts := map[string]int{}
	for _, r := range refs {
		c := comps[r]
		if u := users[r]; len(u) > 0 {
			bins := make([]string, 0, len(u))
			for b := range u {
				bins = append(bins, b)
			}
			sort.Strings(bins)
			c.Properties = &[]cdx.Property{{Name: "gpuaas:linked-into", Value: strings.Join(bins, " ")}}
		}
		list = append(list, *c)
		typ, _, _ := strings.Cut(strings.TrimPrefix(c.PackageURL, "pkg:"), "/")
		counts[typ]++
	}

	bom := cdx.NewBOM()
	// A serial number derived from the index digest: a random one would
	// make two builds of the same sources differ.
	sum := sha256.Sum256([]byte(built.Digest))
	sum[6], sum[8] = (sum[6]&0x0f)|0x50, (sum[8]&0x3f)|0x80
	bom.SerialNumber = fmt.Sprintf("urn:uuid:%x-%x-%x-%x-%x", sum[0:4], sum[4:6], sum[6:8], sum[8:10], sum[10:16])
	repoURL, name := path.Dir(o.repository), path.Base(o.repository)
	bom.Metadata = &cdx.Metadata{
		Timestamp: o.created.Format(time.RFC3339),
		Tools: &cdx.ToolsChoice{Components: &[]cdx.Component{{
			Type: cdx.ComponentTypeApplication, Name: "gpuaas-dra hack/release (github.com/CycloneDX/cyclonedx-go)",
		}}},
		Component: &cdx.Component{
			BOMRef:  "image",
			Type:    cdx.ComponentTypeContainer,
			Name:    o.repository,
			Version: o.version,
			PackageURL: "pkg:oci/" + name + "@" + url.PathEscape(built.Digest) + "?" +
				url.Values{"repository_url": {repoURL + "/" + name}, "tag": {o.version}}.Encode(),
			Hashes: &[]cdx.Hash{{Algorithm: cdx.HashAlgoSHA256, Value: strings.TrimPrefix(built.Digest, "sha256:")}},
		},
	}
	bom.Components = &list
	bom.Dependencies = &[]cdx.Dependency{{Ref: "image", Dependencies: &refs}}
	var buf bytes.Buffer
	enc := cdx.NewBOMEncoder(&buf, cdx.BOMFileFormatJSON).SetPretty(true)
	if err := enc.EncodeVersion(bom, cdx.SpecVersion1_6); err != nil {
		return nil, fmt.Errorf("sbom: %w", err)
	}
	return counts, os.WriteFile(out, buf.Bytes(), 0o644)
}

// addGoModules adds the Go modules (and the standard library) of the
// binary file, at imagePath in the image of arch.
func addGoModules(comps map[string]*cdx.Component, users map[string]map[string]bool, o options, arch, imagePath, file string) error {
	info, err := buildinfo.ReadFile(file)
	if err != nil {
		return fmt.Errorf("sbom: %s: %w", file, err)
	}
	user := "linux/" + arch + ":" + imagePath
	add := func(modPath, version string) {
		if version == "" || version == "(devel)" {
			// A main module built from its directory has no version in
			// its build info: this repository's own is the release's;
			// another (nvidia-cdi-hook's toolkit) is the one go.mod
			// requires, which hack/build-cdi-hook.sh builds.
			version = "v" + o.version
			if modPath != ownModule {
				version = requiredVersion(o.root, modPath)
			}
		}
		purl := "pkg:golang/" + modPath + "@" + version
		if _, ok := comps[purl]; !ok {
			comps[purl] = &cdx.Component{BOMRef: purl, Type: cdx.ComponentTypeLibrary, Name: modPath, Version: version, PackageURL: purl}
		}
		if users[purl] == nil {
			users[purl] = map[string]bool{}
		}
		users[purl][user] = true
	}
	add("stdlib", info.GoVersion)
	add(info.Main.Path, info.Main.Version)
	for _, d := range info.Deps {
		if d.Replace != nil {
			d = d.Replace
		}
		add(d.Path, d.Version)
	}
	return nil
}

// addDebianPackages adds the Debian packages recorded in the base's
// /var/lib/dpkg/status.d (hack/build-image-base.sh writes one control file
// per package it unpacked).
func addDebianPackages(comps map[string]*cdx.Component, rootfs string) error {
	dir := filepath.Join(rootfs, "var", "lib", "dpkg", "status.d")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("sbom: the base's package records (rebuild it with hack/build-image-base.sh): %w", err)
	}
	distro := "debian"
	if v, err := os.ReadFile(filepath.Join(rootfs, "etc", "debian_version")); err == nil {
		distro = "debian-" + strings.TrimSpace(string(v))
	}
	for _, e := range entries {
		fields, err := controlFields(filepath.Join(dir, e.Name()))
		if err != nil {
			return err
		}
		pkg, version, arch := fields["Package"], fields["Version"], fields["Architecture"]
		if pkg == "" || version == "" {
			return fmt.Errorf("sbom: %s: no Package or Version", filepath.Join(dir, e.Name()))
		}
		q := url.Values{"arch": {arch}, "distro": {distro}}
		if src := fields["Source"]; src != "" {
			q.Set("upstream", strings.Fields(src)[0])
		}
		purl := "pkg:deb/debian/" + pkg + "@" + url.PathEscape(version) + "?" + q.Encode()
		c := &cdx.Component{BOMRef: purl, Type: cdx.ComponentTypeLibrary, Name: pkg, Version: version, PackageURL: purl}
		if m := fields["Maintainer"]; m != "" {
			c.Publisher = m
		}
		comps[purl] = c
	}
	return nil
}

// controlFields reads a Debian control paragraph's single-line fields.
func controlFields(file string) (map[string]string, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, fmt.Errorf("sbom: %w", err)
	}
	defer func() { _ = f.Close() }()
	fields := map[string]string{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == ' ' || line[0] == '\t' {
			continue
		}
		if k, v, ok := strings.Cut(line, ":"); ok {
			fields[k] = strings.TrimSpace(v)
		}
	}
	return fields, sc.Err()
}

// ownModule is this repository's Go module.
const ownModule = "github.com/gpuaas/gpu-dra-driver"

// requiredVersion is the version of module modPath that the repository's
// go.mod requires, or "unknown".
func requiredVersion(root, modPath string) string {
	data, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		return "unknown"
	}
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(strings.TrimPrefix(strings.TrimSpace(line), "require "))
		if len(f) >= 2 && f[0] == modPath {
			return f[1]
		}
	}
	return "unknown"
}
