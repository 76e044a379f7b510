package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// tarDir writes the directory dir (regular files and directories) as a
// tarball at out: entries sorted by name, dated mtime, owned by root.
func tarDir(dir, out string, mtime time.Time) error {
	var names []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		if !d.IsDir() && !d.Type().IsRegular() {
			return fmt.Errorf("%s: not a regular file or directory", p)
		}
		names = append(names, p)
		return nil
	})
	if err != nil {
		return fmt.Errorf("tar %s: %w", dir, err)
	}
	sort.Strings(names)
	tmp := out + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	defer func() { _ = os.Remove(tmp) }()
	tw := tar.NewWriter(f)
	for _, p := range names {
		if err := tarEntry(tw, dir, p, mtime); err != nil {
			_ = f.Close()
			return fmt.Errorf("tar %s: %w", dir, err)
		}
	}
	if err := tw.Close(); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, out)
}

func tarEntry(tw *tar.Writer, dir, p string, mtime time.Time) error {
	info, err := os.Stat(p)
	if err != nil {
		return err
	}
	rel, err := filepath.Rel(dir, p)
	if err != nil {
		return err
	}
	hdr := &tar.Header{Name: filepath.ToSlash(rel), Mode: 0o644, ModTime: mtime, Format: tar.FormatPAX, Typeflag: tar.TypeReg, Size: info.Size()}
	if info.IsDir() {
		hdr.Name += "/"
		hdr.Mode, hdr.Typeflag, hdr.Size = 0o755, tar.TypeDir, 0
		return tw.WriteHeader(hdr)
	}
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	src, err := os.Open(p)
	if err != nil {
		return err
	}
	defer func() { _ = src.Close() }()
	_, err = io.Copy(tw, src)
	return err
}

// packageChart packages the chart with the release's version as its
// version and appVersion (and so its default image tag), then rewrites the
// archive with every entry dated o.created and owned by root: helm dates
// them with the time of packaging. It returns the archive's path.
func packageChart(ctx context.Context, o options) (string, error) {
	tmp, err := os.MkdirTemp("", "release-chart-")
	if err != nil {
		return "", err
	}
	defer func() { _ = os.RemoveAll(tmp) }()
	cmd := exec.CommandContext(ctx, o.helm, "package", o.chart, "--version", o.version, "--app-version", o.version, "--destination", tmp)
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+tmp+"/cache", "HELM_CONFIG_HOME="+tmp+"/config", "HELM_DATA_HOME="+tmp+"/data")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("helm package: %w\n%s", err, out)
	}
	matches, err := filepath.Glob(filepath.Join(tmp, "*.tgz"))
	if err != nil || len(matches) != 1 {
		return "", fmt.Errorf("helm package wrote %d archives, want 1", len(matches))
	}
	out := filepath.Join(o.out, filepath.Base(matches[0]))
	return out, normalizeTgz(matches[0], out, o.created)
}

// normalizeTgz copies a gzip'd tarball, keeping its entries and their
// order, with fixed times and owners and a gzip header without name or time.
func normalizeTgz(in, out string, mtime time.Time) error {
	f, err := os.Open(in)
	if err != nil {
		return err
	}
	defer func() { _ = f.Close() }()
	gz, err := gzip.NewReader(f)
	if err != nil {
		return fmt.Errorf("%s: %w", in, err)
	}
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	tr := tar.NewReader(gz)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("%s: %w", in, err)
		}
		if strings.Contains(hdr.Name, "..") {
			return fmt.Errorf("%s: entry %q", in, hdr.Name)
		}
		clean := &tar.Header{Name: hdr.Name, Typeflag: hdr.Typeflag, Mode: hdr.Mode, Size: hdr.Size, Linkname: hdr.Linkname,
			ModTime: mtime, Format: tar.FormatPAX}
		if err := tw.WriteHeader(clean); err != nil {
			return err
		}
		if _, err := io.Copy(tw, tr); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := zw.Close(); err != nil {
		return err
	}
	return os.WriteFile(out, buf.Bytes(), 0o644)
}

// writeChecksums writes sha256sum's format ("<hex>  <name>"), names
// relative to dir, so `sha256sum -c SHA256SUMS` checks them in dir.
func writeChecksums(out, dir string, files []string) error {
	var b strings.Builder
	for _, p := range files {
		sum, err := fileSHA256(p)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		fmt.Fprintf(&b, "%s  %s\n", sum, filepath.ToSlash(rel))
	}
	return os.WriteFile(out, []byte(b.String()), 0o644)
}

func fileSHA256(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer func() { _ = f.Close() }()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
