package timeslice

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
)

// ErrNoBinary means the driver root lacks a tool the settings need: a
// simulated node, or a driver installation without it.
var ErrNoBinary = errors.New("binary not found in the driver root")

// Cmd is one invocation of a driver tool. Args are fixed by the caller's
// code; only a validated GPU UUID and enum values ever go into them.
type Cmd struct {
	Path  string
	Args  []string
	Env   []string
	Stdin string
}

// String renders the command for errors and logs.
func (c Cmd) String() string { return strings.Join(append([]string{c.Path}, c.Args...), " ") }

// Runner runs driver tools; tests use a fake.
type Runner interface {
	Run(ctx context.Context, cmd Cmd) ([]byte, error)
}

// ExecRunner runs commands directly (no shell), with a minimal
// environment plus cmd.Env.
type ExecRunner struct{}

// Run implements Runner.
func (ExecRunner) Run(ctx context.Context, cmd Cmd) ([]byte, error) {
	c := exec.CommandContext(ctx, cmd.Path, cmd.Args...)
	c.Env = append([]string{"PATH=/usr/bin:/bin"}, cmd.Env...)
	c.Stdin = strings.NewReader(cmd.Stdin)
	var out bytes.Buffer
	c.Stdout, c.Stderr = &out, &out
	if err := c.Run(); err != nil {
		return out.Bytes(), fmt.Errorf("running %s: %w: %s", cmd, err, strings.TrimSpace(out.String()))
	}
	return out.Bytes(), nil
}

// binDirs are where NVIDIA installs its tools, relative to the driver root.
var binDirs = []string{"usr/bin", "usr/local/bin", "bin"}

// libDirs are where NVIDIA installs its libraries, relative to the driver
// root (Debian and Red Hat layouts).
var libDirs = []string{"usr/lib/x86_64-linux-gnu", "usr/lib/aarch64-linux-gnu", "usr/lib64", "usr/lib", "lib64", "lib"}

// SMIEnv is the environment nvidia-smi needs to run from a driver root
// that is not this container's root: the driver root's libnvidia-ml,
// preloaded. Only that library: a library path over the driver root's
// directories would also load its libc.so.6 into a binary started by this
// image's loader, and a host whose glibc differs breaks every call.
func SMIEnv(driverRoot string) []string {
	if driverRoot == "" || driverRoot == "/" {
		return nil
	}
	for _, d := range libDirs {
		lib := filepath.Join(driverRoot, d, nvmlLibrary)
		if _, err := os.Stat(lib); err == nil {
			return []string{"LD_PRELOAD=" + lib}
		}
	}
	return nil
}

// nvmlLibrary is what nvidia-smi loads by its soname.
const nvmlLibrary = "libnvidia-ml.so.1"

// FindBinary looks a driver tool up under the driver root; an empty root
// has none.
func FindBinary(driverRoot, name string) (string, error) {
	if driverRoot == "" {
		return "", fmt.Errorf("%s: %w (no driver root configured)", name, ErrNoBinary)
	}
	for _, dir := range binDirs {
		p := filepath.Join(driverRoot, dir, name)
		info, err := os.Stat(p)
		if err == nil && info.Mode().IsRegular() && info.Mode()&0o111 != 0 {
			return p, nil
		}
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("looking for %s: %w", name, err)
		}
	}
	return "", fmt.Errorf("%s: %w %q (looked in %v)", name, ErrNoBinary, driverRoot, binDirs)
}

var gpuUUID = regexp.MustCompile(`^GPU-[0-9a-fA-F-]{8,64}$`)

// ValidateUUID guards the one variable that goes into a command line.
func ValidateUUID(uuid string) error {
	if !gpuUUID.MatchString(uuid) {
		return fmt.Errorf("refusing to pass %q to a driver tool: not a GPU UUID", uuid)
	}
	return nil
}
