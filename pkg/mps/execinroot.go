package mps

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// ExecInRootCommand is the plugin binary's subcommand that the daemon pods
// run: `dra-kubelet-plugin exec-in-driver-root ROOT BINARY ARGS...`. The
// image has no chroot(8), and the daemon must run inside the driver root:
// there it loads the driver's own libc and libraries (never the image's
// mixed with the host's), and finds nvidia-cuda-mps-server, which it
// starts for clients, on the root's PATH.
const ExecInRootCommand = "exec-in-driver-root"

// PodDriverRoot is where a daemon pod mounts the driver root.
const PodDriverRoot = "/driver-root"

// ExecInRoot takes the subcommand's arguments (ROOT BINARY ARGS...),
// changes the root to ROOT and replaces this process with BINARY, a path
// inside it. It returns only on failure.
func ExecInRoot(args []string) error {
	if len(args) < 2 || args[0] == "" {
		return errors.New("usage: " + ExecInRootCommand + " ROOT BINARY [ARGS...]")
	}
	root, argv := args[0], args[1:]
	if err := syscall.Chroot(root); err != nil {
		return fmt.Errorf("chroot %s: %w", root, err)
	}
	if err := os.Chdir("/"); err != nil {
		return fmt.Errorf("chdir / in %s: %w", root, err)
	}
	if err := syscall.Exec(argv[0], argv, os.Environ()); err != nil {
		return fmt.Errorf("running %s in %s: %w", argv[0], root, err)
	}
	return nil
}
