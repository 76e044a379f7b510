package ociimage

import (
	"archive/tar"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"time"
)

// Entry is one item of a layer: a host file, or with Tree a host directory
// tree.
type Entry struct {
	// Path is the absolute path inside the image, e.g. "/bin/app"; for a
	// tree, where Source's root lands ("/" for a root file system).
	Path string
	// Source is the host file whose contents are copied (symbolic links
	// followed), or with Tree the host directory.
	Source string
	// Mode holds a file's permission bits in the image; 0 means those of
	// Source. Trees keep the modes of what they hold.
	Mode int64
	// Tree copies the directory Source and everything below it: regular
	// files, directories and symbolic links (as links, with their targets
	// unchanged). Hard links become separate regular files; sockets,
	// devices and FIFOs are left out, since an image cannot carry them
	// portably and a root file system built from packages needs none.
	Tree bool
}

// File is an Entry naming a host file, the only kind of entry the images
// of the e2e tests have.
type File = Entry

// Layer is one layer of an image: its entries, whose paths (and those of
// everything in their trees) must not collide, except that directories
// merge. Their parent directories are added with mode 0755.
type Layer []Entry

// layerEntry is one tar entry of a layer.
type layerEntry struct {
	name     string // relative, without a leading or trailing slash
	typeflag byte   // tar.TypeDir, tar.TypeReg or tar.TypeSymlink
	mode     int64
	source   string // host file of a regular file
	linkname string // target of a symbolic link
	// implied marks a directory that no entry named (a parent, /tmp); an
	// entry that names it replaces it.
	implied bool
	// origin is the Entry.Path the entry came from, for error messages.
	origin string
}

// countingWriter counts what passes through it.
type countingWriter struct{ n int64 }

func (c *countingWriter) Write(p []byte) (int, error) {
	c.n += int64(len(p))
	return len(p), nil
}

// writeLayer writes the gzip-compressed layer tar to w and returns its blob
// (digest and size of the compressed bytes) and its diff ID (digest of the
// uncompressed tar), both computed in one pass. withTmp adds a /tmp
// directory (mode 1777) unless the layer has one.
func writeLayer(w io.Writer, layer Layer, withTmp bool, mtime time.Time) (blob, string, error) {
	entries, err := layerEntries(layer, withTmp)
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
		if err := writeEntry(tw, e, mtime); err != nil {
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

// layerSet collects a layer's tar entries by name.
type layerSet map[string]*layerEntry

// layerEntries validates the layer, expands its trees and returns all its
// tar entries, with their parent directories, sorted by name so that
// parents precede children and the output does not depend on entry order.
func layerEntries(layer Layer, withTmp bool) ([]layerEntry, error) {
	set := layerSet{}
	if withTmp {
		set["tmp"] = &layerEntry{name: "tmp", typeflag: tar.TypeDir, mode: 0o1777, implied: true, origin: "/tmp"}
	}
	for _, e := range layer {
		if !path.IsAbs(e.Path) || path.Clean(e.Path) != e.Path || (e.Path == "/" && !e.Tree) {
			return nil, fmt.Errorf("entry path %q must be absolute and clean", e.Path)
		}
		add := set.addFile
		if e.Tree {
			add = set.addTree
		}
		if err := add(e); err != nil {
			return nil, err
		}
	}
	if err := set.addParents(); err != nil {
		return nil, err
	}
	entries := make([]layerEntry, 0, len(set))
	for _, le := range set {
		entries = append(entries, *le)
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].name < entries[j].name })
	return entries, nil
}

// add puts le in the set. Two directories merge (a named one replaces an
// implied one, the later of two named ones wins); any other collision is
// an error.
func (s layerSet) add(le *layerEntry) error {
	old := s[le.name]
	switch {
	case old == nil:
		s[le.name] = le
		return nil
	case old.typeflag == tar.TypeDir && le.typeflag == tar.TypeDir:
		if !le.implied {
			s[le.name] = le
		}
		return nil
	case old.implied || le.implied:
		return fmt.Errorf("path %q is a directory of the image, but entry %s makes it a file", "/"+le.name, named(old, le).origin)
	default:
		return fmt.Errorf("path %q given twice (entries %s and %s)", "/"+le.name, old.origin, le.origin)
	}
}

// named returns whichever of a and b an entry named rather than implied.
func named(a, b *layerEntry) *layerEntry {
	if a.implied {
		return b
	}
	return a
}

// addFile adds a host file. Its type is checked here, before anything is
// written, and again when it is copied.
func (s layerSet) addFile(e Entry) error {
	info, err := os.Stat(e.Source)
	if err != nil {
		return fmt.Errorf("entry %s: %w", e.Path, err)
	}
	if !info.Mode().IsRegular() {
		return fmt.Errorf("entry %s: source %s is not a regular file", e.Path, e.Source)
	}
	mode := e.Mode
	if mode == 0 {
		mode = tarMode(info.Mode())
	}
	return s.add(&layerEntry{name: e.Path[1:], typeflag: tar.TypeReg, mode: mode, source: e.Source, origin: e.Path})
}

// addTree adds the directory e.Source and everything below it at e.Path.
func (s layerSet) addTree(e Entry) error {
	// Resolve the root so that a link to the tree (e.g. a "current"
	// symlink) is copied as the tree, not as a link.
	root, err := filepath.EvalSymlinks(e.Source)
	if err != nil {
		return fmt.Errorf("entry %s: %w", e.Path, err)
	}
	info, err := os.Stat(root)
	if err != nil {
		return fmt.Errorf("entry %s: %w", e.Path, err)
	}
	if !info.IsDir() {
		return fmt.Errorf("entry %s: tree source %s is not a directory", e.Path, e.Source)
	}
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		name := path.Join(e.Path, filepath.ToSlash(rel))[1:]
		if name == "" { // the root of a tree at "/" has no entry
			return nil
		}
		le, err := treeEntry(p, d)
		if err != nil || le == nil {
			return err
		}
		le.name, le.origin = name, e.Path
		return s.add(le)
	})
	if err != nil {
		return fmt.Errorf("entry %s: tree %s: %w", e.Path, e.Source, err)
	}
	return nil
}

// treeEntry returns the tar entry of a file in a tree, without its name, or
// nil for a file that an image does not carry.
func treeEntry(p string, d fs.DirEntry) (*layerEntry, error) {
	info, err := d.Info()
	if err != nil {
		return nil, err
	}
	mode := tarMode(info.Mode())
	switch info.Mode().Type() {
	case 0:
		return &layerEntry{typeflag: tar.TypeReg, mode: mode, source: p}, nil
	case fs.ModeDir:
		return &layerEntry{typeflag: tar.TypeDir, mode: mode}, nil
	case fs.ModeSymlink:
		target, err := os.Readlink(p)
		if err != nil {
			return nil, err
		}
		return &layerEntry{typeflag: tar.TypeSymlink, mode: mode, linkname: target}, nil
	default: // socket, device, FIFO
		return nil, nil
	}
}

// tarMode returns the permission bits of m with setuid, setgid and sticky
// in their tar (and chmod) positions; os.FileMode keeps them elsewhere.
func tarMode(m fs.FileMode) int64 {
	mode := int64(m.Perm())
	for bit, tarBit := range map[fs.FileMode]int64{fs.ModeSetuid: 0o4000, fs.ModeSetgid: 0o2000, fs.ModeSticky: 0o1000} {
		if m&bit != 0 {
			mode |= tarBit
		}
	}
	return mode
}

// addParents adds the parent directories of every entry that no entry
// names, and fails when a parent is not a directory.
func (s layerSet) addParents() error {
	entries := make([]*layerEntry, 0, len(s))
	for _, le := range s {
		entries = append(entries, le)
	}
	for _, le := range entries {
		for d := path.Dir(le.name); d != "."; d = path.Dir(d) {
			parent := &layerEntry{name: d, typeflag: tar.TypeDir, mode: 0o755, implied: true, origin: le.origin}
			if err := s.add(parent); err != nil {
				return err
			}
		}
	}
	return nil
}

// writeEntry adds one entry, owned by root and dated mtime, to the layer.
func writeEntry(tw *tar.Writer, e layerEntry, mtime time.Time) error {
	hdr := &tar.Header{Name: e.name, Typeflag: e.typeflag, Mode: e.mode, ModTime: mtime, Format: tar.FormatPAX}
	switch e.typeflag {
	case tar.TypeDir:
		hdr.Name += "/"
	case tar.TypeSymlink:
		hdr.Linkname = e.linkname
	case tar.TypeReg:
		return writeFileEntry(tw, hdr, e)
	}
	if err := tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("layer entry /%s: %w", e.name, err)
	}
	return nil
}

// writeFileEntry copies a regular file into the layer with hdr.
func writeFileEntry(tw *tar.Writer, hdr *tar.Header, e layerEntry) error {
	src, err := os.Open(e.source)
	if err != nil {
		return fmt.Errorf("layer file /%s: %w", e.name, err)
	}
	defer func() { _ = src.Close() }()
	info, err := src.Stat()
	if err != nil {
		return fmt.Errorf("layer file /%s: %w", e.name, err)
	}
	if !info.Mode().IsRegular() {
		return fmt.Errorf("layer file /%s: source %s is not a regular file", e.name, e.source)
	}
	hdr.Size = info.Size()
	if err := tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("layer file /%s: %w", e.name, err)
	}
	// CopyN so a source that grows meanwhile cannot corrupt the tar.
	if _, err := io.CopyN(tw, src, hdr.Size); err != nil {
		if errors.Is(err, io.EOF) {
			err = fmt.Errorf("%s shrank while being copied", e.source)
		}
		return fmt.Errorf("layer file /%s: copy %s: %w", e.name, e.source, err)
	}
	return nil
}
