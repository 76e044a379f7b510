package cdi

import (
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/gpuaas/gpu-dra-driver/pkg/atomicfile"
)

// The NVML hook: NVIDIA's hook, linked dynamically, with the glibc it was
// linked against, installed on the host to set device-memory limits.
//
// The image's nvidia-cdi-hook is static so that it runs whatever the
// host's libc (runc runs it on the host), but a static binary cannot
// dlopen the driver's libnvidia-ml, which apply-cuda-memory-limits must.
// A dynamic hook run by the host's own loader would need the host's glibc
// to be as new as the image's. So the image also ships a dynamic hook, and
// the spec runs it through the image's loader with the image's libraries
// ("ld.so --library-path LIB HOOK ..."): one glibc, the image's, whatever
// the host has; the driver's NVML (built against an old glibc) loads into
// it as into any newer program.
const (
	// DefaultNVMLHookSource is where the release image ships the dynamic
	// hook; the loader and libraries are the image's own.
	DefaultNVMLHookSource = "/usr/lib/gpuaas/nvml-hook/" + HookBinary
	nvmlHookDir           = "nvml-hook"
)

// nvmlRuntimeLibraries are the glibc libraries the hook and the driver's
// libnvidia-ml link against (libnvidia-ml needs libdl, libpthread, libm
// and librt by name, which glibc 2.34 and later still ship as stubs), and
// libgcc_s, which glibc dlopens for thread cancellation and unwinding.
var nvmlRuntimeLibraries = []string{"libc.so.6", "libdl.so.2", "libpthread.so.0", "libm.so.6", "librt.so.1", "libgcc_s.so.1"}

// NVMLHook is an installed NVML hook: the loader to run, its library
// directory and the hook binary, all host paths (zero: none installed).
type NVMLHook struct {
	Loader, LibDir, Binary string
}

// command is how a spec runs the hook: through its own loader, which
// looks for every library (the driver's NVML's too) in LibDir first
// (--library-path takes the place of LD_LIBRARY_PATH).
func (h NVMLHook) command(hookArgs ...string) (string, []string) {
	args := []string{filepath.Base(h.Loader), "--library-path", h.LibDir, h.Binary}
	return h.Loader, append(args, hookArgs...)
}

// InstallNVMLHook copies the dynamic hook src, the loader it names
// (PT_INTERP, as this process sees it: the image's) and the glibc
// libraries beside that loader into dir/nvml-hook, a host directory this
// process sees at the same path. As InstallHook, unchanged files are not
// rewritten, so that two plugin pods of a rolling update may both do it.
func InstallNVMLHook(src, dir string) (NVMLHook, error) {
	interp, err := elfInterpreter(src)
	if err != nil {
		return NVMLHook{}, err
	}
	loader, err := filepath.EvalSymlinks(interp)
	if err != nil {
		return NVMLHook{}, fmt.Errorf("the NVML hook %s names the loader %s, which is not here: %w", src, interp, err)
	}
	libSrc := filepath.Dir(loader)
	base := filepath.Join(dir, nvmlHookDir)
	h := NVMLHook{Loader: filepath.Join(base, "lib", filepath.Base(interp)), LibDir: filepath.Join(base, "lib"),
		Binary: filepath.Join(base, "bin", HookBinary)}
	files := [][2]string{{src, h.Binary}, {loader, h.Loader}}
	for _, lib := range nvmlRuntimeLibraries {
		files = append(files, [2]string{filepath.Join(libSrc, lib), filepath.Join(h.LibDir, lib)})
	}
	for _, f := range files {
		if err := installFile(f[0], f[1]); err != nil {
			return NVMLHook{}, fmt.Errorf("installing the NVML hook: %w", err)
		}
	}
	return h, nil
}

// elfInterpreter is the program interpreter a dynamic executable names,
// or an error saying the file is none.
func elfInterpreter(path string) (string, error) {
	f, err := elf.Open(path)
	if err != nil {
		return "", fmt.Errorf("reading the NVML hook %s: %w", path, err)
	}
	defer func() { _ = f.Close() }()
	for _, p := range f.Progs {
		if p.Type != elf.PT_INTERP {
			continue
		}
		data, err := io.ReadAll(p.Open())
		if err != nil {
			return "", fmt.Errorf("reading the loader %s names: %w", path, err)
		}
		return string(bytes.TrimRight(data, "\x00")), nil
	}
	return "", fmt.Errorf("the NVML hook %s is statically linked: it cannot load the driver's NVML", path)
}

// installFile copies src (symlinks followed) to dst, executable, unless
// dst already holds the same bytes.
func installFile(src, dst string) error {
	data, err := os.ReadFile(src)
	if err != nil {
		return fmt.Errorf("reading %s: %w", src, err)
	}
	if old, err := os.ReadFile(dst); err == nil && bytes.Equal(old, data) {
		return nil
	} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("reading the installed %s: %w", dst, err)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", filepath.Dir(dst), err)
	}
	name := filepath.Base(dst)
	if err := atomicfile.Write(dst, data, 0o755, "."+name+"-*"); err != nil {
		return fmt.Errorf("writing %s: %w", dst, err)
	}
	return nil
}
