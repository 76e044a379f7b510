package cdi

import (
	"fmt"
	"path/filepath"
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
	dst := filepath.Join(dir, "bin", HookBinary)
	if err := installFile(src, dst); err != nil {
		return "", fmt.Errorf("installing %s on the host: %w", HookBinary, err)
	}
	return dst, nil
}
