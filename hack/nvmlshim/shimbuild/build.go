// Package shimbuild builds the simulated NVML library (hack/nvmlshim) for
// tests, cached under _output/nvml/cache by a hash of every file it is
// built from, so that only a change of its sources (or of Go, or of the
// cgo flags) builds it again: minutes cold, tens of seconds warm.
package shimbuild

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"
)

// LibraryName is the file the driver's NVML is loaded as.
const LibraryName = "libnvidia-ml.so.1"

// Library returns the library built from the module at root (cached), and
// how long building it took (zero when it was cached).
func Library(root string) (string, time.Duration, error) {
	key, err := sourcesKey(root, "./hack/nvmlshim")
	if err != nil {
		return "", 0, err
	}
	lib := filepath.Join(root, "_output", "nvml", "cache", key, LibraryName)
	if _, err := os.Stat(lib); err == nil {
		return lib, 0, nil
	}
	if err := os.MkdirAll(filepath.Dir(lib), 0o755); err != nil {
		return "", 0, err
	}
	start := time.Now()
	tmp := fmt.Sprintf("%s.tmp-%d", lib, os.Getpid())
	if err := Go(root, "build", "-buildmode=c-shared", "-ldflags=-extldflags=-Wl,-soname,"+LibraryName,
		"-o", tmp, "./hack/nvmlshim"); err != nil {
		return "", 0, err
	}
	// The C header go build writes beside it is of no use.
	headers, _ := filepath.Glob(filepath.Join(filepath.Dir(lib), "*.h"))
	for _, h := range headers {
		_ = os.Remove(h)
	}
	if err := os.Rename(tmp, lib); err != nil {
		return "", 0, err
	}
	return lib, time.Since(start), nil
}

// Go runs the go command in root.
func Go(root string, args ...string) error {
	cmd := exec.Command("go", args...)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go %v: %w\n%s", args, err, out)
	}
	return nil
}

// sourcesKey hashes every file pkg is built from (its own and every
// non-standard dependency's), the Go version and the cgo flags.
func sourcesKey(root, pkg string) (string, error) {
	cmd := exec.Command("go", "list", "-deps", "-f",
		`{{if not .Standard}}{{.Dir}}|{{join .GoFiles ","}},{{join .CgoFiles ","}},{{join .CFiles ","}},{{join .HFiles ","}}{{end}}`,
		pkg)
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go list %s: %w", pkg, err)
	}
	h := sha256.New()
	_, _ = fmt.Fprintln(h, runtime.Version(), os.Getenv("CGO_CFLAGS"))
	for line := range strings.Lines(string(out)) {
		dir, files, ok := strings.Cut(strings.TrimSpace(line), "|")
		if !ok {
			continue
		}
		for f := range strings.SplitSeq(files, ",") {
			if f == "" {
				continue
			}
			data, err := os.ReadFile(filepath.Join(dir, f))
			if err != nil {
				return "", err
			}
			_, _ = fmt.Fprintf(h, "%s/%s %d\n", dir, f, len(data))
			h.Write(data)
		}
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}
