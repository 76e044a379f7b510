package cdi

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"k8s.io/klog/v2"
	specs "tags.cncf.io/container-device-interface/specs-go"
)

// tempInfix marks our temporary files. They start with a dot and do not end
// in .json or .yaml, so neither the CDI cache of the runtime nor
// ClaimSpecUIDs ever reads a half-written spec.
const tempInfix = ".tmp"

func writeSpec(path string, spec *specs.Spec) error {
	data, err := json.Marshal(spec)
	if err != nil {
		return fmt.Errorf("marshal CDI spec: %w", err)
	}
	if err := writeFileAtomic(path, data); err != nil {
		return fmt.Errorf("write CDI spec %q: %w", path, err)
	}
	return nil
}

// writeFileAtomic replaces path with data so that a reader sees either the old
// or the new content, and the new content survives a crash once we return:
// temp file in the same directory, fsync, rename, fsync of the directory.
func writeFileAtomic(path string, data []byte) (err error) {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+tempInfix+"*")
	if err != nil {
		return fmt.Errorf("create temp file: %w", err)
	}
	defer func() {
		if err != nil {
			_ = tmp.Close()
			_ = os.Remove(tmp.Name())
		}
	}()
	if err = fillAndClose(tmp, data); err != nil {
		return err
	}
	if err = os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("rename temp file: %w", err)
	}
	return syncDir(dir)
}

func fillAndClose(f *os.File, data []byte) error {
	if _, err := f.Write(data); err != nil {
		return fmt.Errorf("write temp file: %w", err)
	}
	// CreateTemp makes 0600 files; the runtime reads specs as root anyway,
	// but CDI tools run by admins expect world-readable specs.
	if err := f.Chmod(specFileMode); err != nil {
		return fmt.Errorf("chmod temp file: %w", err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("sync temp file: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close temp file: %w", err)
	}
	return nil
}

// syncDir makes a rename in dir durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("open dir for sync: %w", err)
	}
	err = d.Sync()
	return errors.Join(wrapErr("sync dir", err), wrapErr("close dir", d.Close()))
}

func wrapErr(what string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s: %w", what, err)
}

// removeStaleTempFiles deletes temp files a crash left behind. Only called
// from NewHandler, before any write of this process can be in flight.
func removeStaleTempFiles(log klog.Logger, cdiRoot string) {
	entries, err := os.ReadDir(cdiRoot)
	if err != nil {
		log.Error(err, "Listing CDI root for stale temp files", "cdiRoot", cdiRoot)
		return
	}
	prefix := "." + specFilePrefix
	for _, e := range entries {
		name := e.Name()
		if !strings.HasPrefix(name, prefix) || !strings.Contains(name, specFileSuffix+tempInfix) {
			continue
		}
		if err := os.Remove(filepath.Join(cdiRoot, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			log.Error(err, "Removing stale temp file", "file", name)
			continue
		}
		log.V(1).Info("Removed stale temp CDI spec", "file", name)
	}
}
