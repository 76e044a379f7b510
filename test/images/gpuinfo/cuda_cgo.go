//go:build cgo

package main

/*
// dlopen and friends moved into libc with glibc 2.34; older ones need
// libdl, and linking it is harmless on newer ones.
#cgo LDFLAGS: -ldl
#ifndef _GNU_SOURCE
#define _GNU_SOURCE // dlinfo
#endif
#include <dlfcn.h>
#include <link.h>
#include <stdlib.h>

// The driver's entry points as the C ABI sees them (CUresult and
// nvmlReturn_t are enums), so that building needs no CUDA headers.
typedef int (*gpuinfo_cu_init_fn)(unsigned int);
typedef int (*gpuinfo_void_fn)(void);

static void *gpuinfo_dlopen(const char *soname) {
	return dlopen(soname, RTLD_NOW | RTLD_LOCAL);
}

static int gpuinfo_call_cu_init(void *fn, unsigned int flags) {
	return ((gpuinfo_cu_init_fn)fn)(flags);
}

static int gpuinfo_call_void(void *fn) {
	return ((gpuinfo_void_fn)fn)();
}

// gpuinfo_loaded_from returns the file name the dynamic loader opened
// for handle, or NULL with dlerror() set.
static const char *gpuinfo_loaded_from(void *handle) {
	struct link_map *map = NULL;
	if (dlinfo(handle, RTLD_DI_LINKMAP, &map) != 0 || map == NULL) {
		return NULL;
	}
	return map->l_name;
}
*/
import "C"

import (
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"unsafe"
)

// initFunc initializes a loaded driver library and reports the outcome as
// lines starting with prefix.
type initFunc func(handle unsafe.Pointer, prefix string) []string

// probeLibraries loads the driver's CUDA and NVML libraries by soname, the
// way a CUDA program does, so it exercises what CDI injected: the mounted
// files, the soname links and the ld.so.cache that nvidia-cdi-hook made.
// A dlopen error means the injection is broken; an init error (no device,
// driver not loaded) means it worked as far as userspace goes.
func probeLibraries() []string {
	// dlerror() belongs to the calling thread; staying on one thread makes
	// each error read describe the dl call just before it.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	lines := probeLibrary("libcuda.so.1", initCUDA)
	return append(lines, probeLibrary("libnvidia-ml.so.1", initNVML)...)
}

// probeLibrary loads soname and reports where it came from and what
// initialize says. The library stays loaded: libcuda starts threads in
// cuInit and is not safe to unload, and the program only sleeps afterwards.
func probeLibrary(soname string, initialize initFunc) []string {
	prefix := "cuda " + soname + " "
	cSoname := C.CString(soname)
	defer C.free(unsafe.Pointer(cSoname))
	handle := C.gpuinfo_dlopen(cSoname)
	if handle == nil {
		return []string{prefix + "dlopen-error=" + dlerror()}
	}
	return append(initialize(handle, prefix), pathLine(handle, prefix))
}

// pathLine reports the file behind handle with symbolic links resolved:
// the soname is a link the hook made, the file it names is what the CDI
// spec mounted, and its name carries the driver version.
func pathLine(handle unsafe.Pointer, prefix string) string {
	cPath := C.gpuinfo_loaded_from(handle)
	if cPath == nil {
		return prefix + "path-error=" + dlerror()
	}
	loaded := C.GoString(cPath)
	if resolved, err := filepath.EvalSymlinks(loaded); err == nil {
		return prefix + "path=" + resolved
	}
	return prefix + "path=" + loaded
}

// initCUDA calls cuInit(0), which every CUDA program does first.
func initCUDA(handle unsafe.Pointer, prefix string) []string {
	fn, err := lookup(handle, "cuInit")
	if err != nil {
		return []string{prefix + "dlsym-error=" + err.Error()}
	}
	return []string{fmt.Sprintf("%scuInit=%d", prefix, C.gpuinfo_call_cu_init(fn, 0))}
}

// initNVML calls nvmlInit_v2() and, when that succeeded, nvmlShutdown(),
// so that NVML's hold on the driver does not outlive the probe.
func initNVML(handle unsafe.Pointer, prefix string) []string {
	fn, err := lookup(handle, "nvmlInit_v2")
	if err != nil {
		return []string{prefix + "dlsym-error=" + err.Error()}
	}
	rc := C.gpuinfo_call_void(fn)
	lines := []string{fmt.Sprintf("%snvmlInit=%d", prefix, rc)}
	if rc != 0 {
		return lines
	}
	shutdown, err := lookup(handle, "nvmlShutdown")
	if err != nil {
		return append(lines, prefix+"dlsym-error="+err.Error())
	}
	return append(lines, fmt.Sprintf("%snvmlShutdown=%d", prefix, C.gpuinfo_call_void(shutdown)))
}

// lookup returns the address of the function name in handle.
func lookup(handle unsafe.Pointer, name string) (unsafe.Pointer, error) {
	cName := C.CString(name)
	defer C.free(unsafe.Pointer(cName))
	C.dlerror() // Clear an old error, so a new one is this lookup's.
	fn := C.dlsym(handle, cName)
	if fn == nil {
		return nil, errors.New(dlerror())
	}
	return fn, nil
}

// dlerror returns the dynamic loader's message for the failed call just
// before, on one line.
func dlerror() string {
	msg := C.dlerror()
	if msg == nil {
		return "no error message"
	}
	return oneLine(C.GoString(msg))
}
