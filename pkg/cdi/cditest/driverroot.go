// Package cditest builds fake NVIDIA driver installations for tests, so that
// the driver-file discovery of nvcdi runs against real files without a GPU.
package cditest

import (
	"debug/elf"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// LibDir is where the fake driver's libraries live, relative to the root; it
// is one of the directories nvcdi's library locator searches.
const LibDir = "/usr/lib/x86_64-linux-gnu"

// libraries are versioned driver libraries, as the driver installer names
// them ("<name>.so.<driver version>").
var libraries = []string{
	"libcuda.so",
	"libnvidia-ml.so",
	"libnvidia-ptxjitcompiler.so",
	"libnvidia-nvvm.so",
	"libnvidia-cfg.so",
}

// Binaries are the driver binaries the fake root installs under /usr/bin.
var Binaries = []string{"nvidia-smi", "nvidia-debugdump", "nvidia-persistenced"}

// DevNodes are the device nodes the fake root has under /dev: the control
// nodes and one /dev/nvidiaN per GPU of go-nvml's 8-GPU mock machines. They
// are plain files: nvcdi (looking for char devices) ignores them, as it
// would on a host without the kernel module loaded, while the handler's
// check that a node exists finds them.
var DevNodes = []string{
	"nvidiactl", "nvidia-uvm", "nvidia-uvm-tools",
	"nvidia0", "nvidia1", "nvidia2", "nvidia3", "nvidia4", "nvidia5", "nvidia6", "nvidia7",
}

// DriverRoot is a fake driver installation in a temp dir.
type DriverRoot struct {
	// Root is the directory to pass as driver root.
	Root string
	// Version is the driver version the files are named after.
	Version string
}

// NewDriverRoot creates a fake driver root for driverVersion, e.g. the
// version a go-nvml mock server reports. It is removed when t ends.
func NewDriverRoot(t testing.TB, driverVersion string) *DriverRoot {
	t.Helper()
	r := &DriverRoot{Root: t.TempDir(), Version: driverVersion}
	for _, lib := range libraries {
		r.write(t, r.LibPath(lib), 0o644)
		// The soname link the dynamic linker would create.
		r.symlink(t, lib+"."+driverVersion, filepath.Join(r.Root, LibDir, soname(lib)))
	}
	for _, bin := range Binaries {
		r.write(t, "/usr/bin/"+bin, 0o755)
	}
	for _, node := range DevNodes {
		r.write(t, "/dev/"+node, 0o666)
	}
	return r
}

// LibPath is the path, relative to the root, of the versioned library name
// (e.g. "libcuda.so" -> /usr/lib/x86_64-linux-gnu/libcuda.so.<version>).
func (r *DriverRoot) LibPath(name string) string {
	return filepath.Join(LibDir, name+"."+r.Version)
}

// HostPath is path (relative to the root) as seen from the host.
func (r *DriverRoot) HostPath(path string) string {
	return filepath.Join(r.Root, path)
}

func (r *DriverRoot) write(t testing.TB, path string, mode os.FileMode) {
	t.Helper()
	full := r.HostPath(path)
	if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
		t.Fatalf("fake driver root: %v", err)
	}
	if err := os.WriteFile(full, nil, mode); err != nil {
		t.Fatalf("fake driver root: %v", err)
	}
}

func (r *DriverRoot) symlink(t testing.TB, target, link string) {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Fatalf("fake driver root: %v", err)
	}
}

func soname(lib string) string {
	return lib + ".1"
}

// Upgrade replaces the driver's libraries by those of version, as a
// driver upgrade does: the versioned files of the old version are gone,
// the soname links point at the new ones.
func (r *DriverRoot) Upgrade(t testing.TB, version string) {
	t.Helper()
	old := r.Version
	for _, lib := range libraries {
		from := r.HostPath(filepath.Join(LibDir, lib+"."+old))
		to := r.HostPath(filepath.Join(LibDir, lib+"."+version))
		if err := os.Rename(from, to); err != nil {
			t.Fatalf("fake driver upgrade: %v", err)
		}
		link := filepath.Join(r.Root, LibDir, soname(lib))
		if err := os.Remove(link); err != nil {
			t.Fatalf("fake driver upgrade: %v", err)
		}
		r.symlink(t, lib+"."+version, link)
	}
	r.Version = version
}

// DynamicHook is a dynamically linked executable named nvidia-cdi-hook
// in a temp dir: what the CDI handler's memory-limit check wants of the
// hook binary (one that can dlopen the driver's NVML). It is never run.
func DynamicHook(t testing.TB) string {
	t.Helper()
	for _, c := range []string{"/bin/sh", "/usr/bin/env", "/bin/true"} {
		f, err := elf.Open(c)
		if err != nil {
			continue
		}
		dynamic := slices.ContainsFunc(f.Progs, func(p *elf.Prog) bool { return p.Type == elf.PT_INTERP })
		_ = f.Close()
		if !dynamic {
			continue
		}
		hook := filepath.Join(t.TempDir(), "nvidia-cdi-hook")
		if err := os.Symlink(c, hook); err != nil {
			t.Fatal(err)
		}
		return hook
	}
	t.Fatal("no dynamically linked executable to stand for nvidia-cdi-hook")
	return ""
}
