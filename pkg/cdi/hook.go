package cdi

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/gpuaas/gpu-dra-driver/pkg/atomicfile"
)

// HookBinary is NVIDIA's CDI hook, which the container runtime runs while
// it creates a container: it updates the container's ldcache (so that
// libcuda.so.1 resolves: nvcdi mounts only the versioned files) and makes
// the driver's symlinks. The release image ships it at DefaultHookSource.
const (
	HookBinary        = "nvidia-cdi-hook"
	DefaultHookSource = "/usr/bin/" + HookBinary
	// HooksDisabled as the hook path leaves NVIDIA's hooks out of the
	// specs: only for runtimes that make the links themselves.
	HooksDisabled = "none"
)

// InstallHook copies the hook binary src (the one in this image) into
// dir, a host directory this process sees at the same path (the plugin's
// data directory), and returns its path there: the runtime runs hooks on
// the host, where the image's file does not exist. An unchanged binary is
// not rewritten, so that two plugin pods of a rolling update may both do it.
func InstallHook(src, dir string) (string, error) {
	data, err := os.ReadFile(src)
	if err != nil {
		return "", fmt.Errorf("reading %s to install it on the host: %w", src, err)
	}
	dst := filepath.Join(dir, "bin", HookBinary)
	if old, err := os.ReadFile(dst); err == nil && bytes.Equal(old, data) {
		return dst, nil
	} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("reading the installed %s: %w", dst, err)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return "", fmt.Errorf("installing %s: %w", HookBinary, err)
	}
	if err := atomicfile.Write(dst, data, 0o755, "."+HookBinary+"-*"); err != nil {
		return "", fmt.Errorf("installing %s at %s: %w", HookBinary, dst, err)
	}
	return dst, nil
}
