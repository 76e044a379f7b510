package ociimage

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
)

// errStaticCgo is why StaticBinary refuses cgo.
var errStaticCgo = errors.New("a statically linked cgo binary cannot load NVML: " +
	"go-nvml dlopen()s libnvidia-ml.so.1 at run time, and glibc's dlopen in a static " +
	"executable crashes loading a shared library built for the dynamic loader; " +
	"build cgo binaries with DynamicBinary into an image that has glibc")

// StaticBinary builds the Go main package pkg (a path relative to repoRoot,
// e.g. "test/images/pause") into a statically linked linux/amd64 executable
// at out, with CGO_ENABLED=0, so it runs in an image with no libc.
//
// cgo must be false: it is an error otherwise (errStaticCgo says why). The
// parameter remains so that callers state that their binary needs no cgo.
func StaticBinary(ctx context.Context, repoRoot, pkg, out string, cgo bool) error {
	if cgo {
		return fmt.Errorf("build %s: %w", pkg, errStaticCgo)
	}
	return goBuild(ctx, repoRoot, pkg, out, false, []string{"-trimpath"})
}

// DynamicBinary builds the Go main package pkg (a path relative to
// repoRoot, e.g. "cmd/dra-kubelet-plugin") into an ordinary dynamically
// linked linux/amd64 cgo executable at out, for an image that has glibc:
// go-nvml dlopen()s libnvidia-ml from the driver root at run time, which
// only works in a dynamically linked process. Symbol tables and DWARF are
// stripped (-s -w). vars are set with -ldflags -X, e.g.
// {"github.com/gpuaas/gpu-dra-driver/pkg/version.version": "0.1.0"}.
func DynamicBinary(ctx context.Context, repoRoot, pkg, out string, vars map[string]string) error {
	return DynamicBinaryForArch(ctx, repoRoot, pkg, out, imageArch, vars)
}

// CrossCC is the C cross compiler cgo uses for each architecture other
// than amd64 (Debian's gcc-aarch64-linux-gnu; hack/build-cross.sh installs it).
var CrossCC = map[string]string{"arm64": "aarch64-linux-gnu-gcc"}

// DynamicBinaryForArch is DynamicBinary for linux/<arch>. For an arch other
// than the machine's, cgo compiles with CrossCC[arch], so the binary links
// against that architecture's glibc as the image base has it.
func DynamicBinaryForArch(ctx context.Context, repoRoot, pkg, out, arch string, vars map[string]string) error {
	ldflags, err := ldflagsWithVars([]string{"-s", "-w"}, vars)
	if err != nil {
		return fmt.Errorf("build %s: %w", pkg, err)
	}
	var env []string
	if arch != runtime.GOARCH {
		cc, ok := CrossCC[arch]
		if !ok {
			return fmt.Errorf("build %s: no C cross compiler known for %s", pkg, arch)
		}
		env = append(env, "CC="+cc)
	}
	return goBuildArch(ctx, repoRoot, pkg, out, arch, true, env, []string{"-trimpath", "-ldflags", ldflags})
}

// ldflagsWithVars appends "-X name=value" for each of vars, sorted so the
// command line (and the binary) do not depend on map order.
func ldflagsWithVars(flags []string, vars map[string]string) (string, error) {
	names := make([]string, 0, len(vars))
	for name := range vars {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		v := name + "=" + vars[name]
		// The go command splits -ldflags on spaces and quotes; values
		// are versions and commits, so refuse rather than quote.
		if name == "" || strings.ContainsAny(v, " \t\n'\"\\") {
			return "", fmt.Errorf("-X %q: the variable and its value must not be empty or hold spaces, quotes or backslashes", v)
		}
		flags = append(flags, "-X", v)
	}
	return strings.Join(flags, " "), nil
}

// goBuild runs go build for linux/amd64 in repoRoot with the given flags.
// CGO_CFLAGS silences the deprecation warnings of go-nvml's header, as the
// Makefile does.
func goBuild(ctx context.Context, repoRoot, pkg, out string, cgo bool, flags []string) error {
	return goBuildArch(ctx, repoRoot, pkg, out, imageArch, cgo, nil, flags)
}

// goBuildArch is goBuild for linux/<arch>, with env added to the go
// command's environment.
func goBuildArch(ctx context.Context, repoRoot, pkg, out, arch string, cgo bool, env, flags []string) error {
	absOut, err := filepath.Abs(out)
	if err != nil {
		return fmt.Errorf("build %s: output path: %w", pkg, err)
	}
	args := append(append([]string{"build"}, flags...),
		"-o", absOut, "./"+strings.TrimPrefix(filepath.ToSlash(pkg), "./"))
	cgoEnabled := "0"
	if cgo {
		cgoEnabled = "1"
	}
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = repoRoot
	cmd.Env = append(os.Environ(),
		"CGO_ENABLED="+cgoEnabled,
		"CGO_CFLAGS=-O2 -g -Wno-deprecated-declarations",
		"GOOS="+imageOS,
		"GOARCH="+arch,
	)
	cmd.Env = append(cmd.Env, env...)
	output, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("go %s (CGO_ENABLED=%s): %w\n%s", strings.Join(args, " "), cgoEnabled, err, output)
	}
	return nil
}
