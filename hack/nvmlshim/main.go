// Command nvmlshim is a simulated NVIDIA driver library: built with
// -buildmode=c-shared it is a libnvidia-ml.so.1 that exports NVML's C API
// and answers it from one of our simulated machines (pkg/nvdev/nvmock),
// MIG included. A program that dlopens the driver's NVML (our plugin with
// --nvml real, NVIDIA's plugin, go-nvml in general) put on a driver root
// holding it reads the simulated machine through the production code
// path. Which machine, and where its state lives, the environment says:
//
//	GPUAAS_MOCK_NVML_MACHINE    dgxh100 (default), dgxa100, dgxh200, dgxb200
//	GPUAAS_MOCK_NVML_STATE_DIR  the machine's state directory, shared with
//	                            hack/mocknvml and --mock-nvml-state-dir;
//	                            empty keeps the machine in memory
//	GPUAAS_MOCK_NVML_SEED       what the GPU UUIDs derive from (the node
//	                            name); default the host name
//	GPUAAS_MOCK_NVML_DRIVER_ROOT a driver root whose real userspace's
//	                            version the machine reports; default the
//	                            one the library was loaded from
//	GPUAAS_MOCK_NVML_TRACE      1: every call answered NOT_SUPPORTED by a
//	                            stub is logged to stderr
//
// See docs/simulated-nvml.md. It lives under hack/, not cmd/: it is a test
// tool beside mocknvml, never shipped in the release image.
package main

//go:generate go run ./genstubs

/*
#include <stdint.h>
#include <stdlib.h>

// shimPath is the path this library was loaded from (shimpath.c).
extern const char *shimPath(void);
*/
import "C"

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"unsafe"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev/nvmock"
)

// main is never run: the package is built as a shared library.
func main() {}

// Environment variables that configure the simulated machine.
const (
	envMachine    = "GPUAAS_MOCK_NVML_MACHINE"
	envStateDir   = "GPUAAS_MOCK_NVML_STATE_DIR"
	envSeed       = "GPUAAS_MOCK_NVML_SEED"
	envDriverRoot = "GPUAAS_MOCK_NVML_DRIVER_ROOT"
	envTrace      = "GPUAAS_MOCK_NVML_TRACE"
	defaultMach   = "dgxh100"
)

// session is the library's NVML session: NVML counts nvmlInit calls and
// shuts down at the last nvmlShutdown.
var session struct {
	mu      sync.Mutex
	refs    int
	lib     nvml.Interface
	release func()
}

// current is the open machine, nil before nvmlInit and after the last
// nvmlShutdown.
func current() nvml.Interface {
	session.mu.Lock()
	defer session.mu.Unlock()
	return session.lib
}

func options() (string, nvdev.Options) {
	machine := os.Getenv(envMachine)
	if machine == "" {
		machine = defaultMach
	}
	seed := os.Getenv(envSeed)
	if seed == "" {
		seed, _ = os.Hostname()
	}
	root := os.Getenv(envDriverRoot)
	if root == "" {
		root = ownDriverRoot()
	}
	return machine, nvdev.Options{MockSeed: seed, MockStateDir: os.Getenv(envStateDir), DriverRoot: root}
}

// libraryDirs are where --nvml real finds libnvidia-ml.so.1 under a
// driver root (pkg/nvdev's libraryCandidates).
var libraryDirs = []string{"usr/lib64", "usr/lib/x86_64-linux-gnu", "usr/lib/aarch64-linux-gnu", "usr/lib", "lib64"}

// ownDriverRoot is the driver root this library was loaded from (the
// directory above usr/lib64/libnvidia-ml.so.1), "" if it was loaded from
// elsewhere: the machine then reports the version of the real userspace
// beside it, as the mock backend does for --driver-root.
func ownDriverRoot() string {
	p := C.shimPath()
	if p == nil {
		return ""
	}
	dir := filepath.Dir(C.GoString(p))
	for _, d := range libraryDirs {
		if root, ok := strings.CutSuffix(dir, "/"+d); ok && root != "" {
			return root
		}
	}
	return ""
}

func initSession() nvml.Return {
	session.mu.Lock()
	defer session.mu.Unlock()
	if session.refs > 0 {
		session.refs++
		return nvml.SUCCESS
	}
	machine, opts := options()
	lib, release, err := nvmock.NewLibrary(machine, opts)
	if err != nil {
		var ret nvml.Return
		if errors.As(err, &ret) {
			return ret
		}
		logf("nvmlInit: %v", err)
		return nvml.ERROR_UNKNOWN
	}
	if ret := lib.Init(); ret != nvml.SUCCESS {
		if release != nil {
			release()
		}
		return ret
	}
	session.lib, session.release, session.refs = lib, release, 1
	return nvml.SUCCESS
}

func shutdownSession() nvml.Return {
	session.mu.Lock()
	defer session.mu.Unlock()
	if session.refs == 0 {
		return nvml.ERROR_UNINITIALIZED
	}
	session.refs--
	if session.refs > 0 {
		return nvml.SUCCESS
	}
	ret := session.lib.Shutdown()
	if session.release != nil {
		session.release()
	}
	session.lib, session.release = nil, nil
	handles.reset()
	return ret
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "gpuaas simulated NVML: "+format+"\n", args...)
}

// call runs one API call: NVML_ERROR_UNINITIALIZED without a session, and
// a panic (a go-nvml mock function the machine does not set) answers
// NOT_SUPPORTED or UNKNOWN instead of taking the caller's process down.
func call(name string, f func(lib nvml.Interface) nvml.Return) (ret C.int) {
	defer func() {
		if r := recover(); r != nil {
			if strings.Contains(fmt.Sprint(r), "is nil but") {
				traceStub(name)
				ret = C.int(nvml.ERROR_NOT_SUPPORTED)
				return
			}
			logf("%s: panic: %v", name, r)
			ret = C.int(nvml.ERROR_UNKNOWN)
		}
	}()
	lib := current()
	if lib == nil {
		return C.int(nvml.ERROR_UNINITIALIZED)
	}
	return C.int(f(lib))
}

var traceOn = os.Getenv(envTrace) == "1"

func traceStub(name string) {
	if traceOn {
		logf("%s: not supported by the simulated machine", name)
	}
}

//export gpuaasShimStub
func gpuaasShimStub(name *C.char) C.int {
	traceStub(C.GoString(name))
	return C.int(nvml.ERROR_NOT_SUPPORTED)
}

// handles maps the opaque handles C callers hold (nvmlDevice_t,
// nvmlGpuInstance_t, nvmlComputeInstance_t, nvmlEventSet_t) to the Go
// objects of the simulated machine. A handle is the address of a small
// block of C memory, never a Go pointer: no Go pointer reaches C, and a
// handle can never alias either runtime's heap (the host's garbage
// collector sees it in its nvmlDevice structs as real NVML's pointers).
var handles = &handleTable{}

type handleTable struct {
	mu   sync.Mutex
	objs map[uintptr]handleEntry
	// keys: one handle per object, and per UUID for MIG devices (the
	// machine makes a new Go object at each lookup; NVML hands out one
	// handle per MIG device).
	keys map[any]uintptr
}

func (t *handleTable) reset() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, e := range t.objs {
		C.free(e.mem)
	}
	t.objs, t.keys = nil, nil
}

func keyOf(obj any) any {
	if d, ok := obj.(nvml.Device); ok {
		if isMig, ret := d.IsMigDeviceHandle(); ret == nvml.SUCCESS && isMig {
			if id, ret := d.GetUUID(); ret == nvml.SUCCESS {
				return "mig:" + id
			}
		}
	}
	return obj
}

// of returns obj's handle, making one the first time.
func (t *handleTable) of(obj any) C.uintptr_t {
	key := safeKey(obj)
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.objs == nil {
		t.objs, t.keys = map[uintptr]handleEntry{}, map[any]uintptr{}
	}
	if h, ok := t.keys[key]; ok {
		t.objs[h] = handleEntry{mem: t.objs[h].mem, obj: obj}
		return C.uintptr_t(h)
	}
	mem := C.malloc(16)
	h := uintptr(mem)
	t.objs[h], t.keys[key] = handleEntry{mem: mem, obj: obj}, h
	return C.uintptr_t(h)
}

func safeKey(obj any) (key any) {
	defer func() {
		if recover() != nil {
			key = obj
		}
	}()
	return keyOf(obj)
}

// drop forgets a handle the caller freed (a GPM sample) and frees its
// memory; later calls with it answer INVALID_ARGUMENT.
func (t *handleTable) drop(h C.uintptr_t) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.objs[uintptr(h)]
	if !ok {
		return
	}
	for k, v := range t.keys {
		if v == uintptr(h) {
			delete(t.keys, k)
		}
	}
	delete(t.objs, uintptr(h))
	C.free(e.mem)
}

func (t *handleTable) get(h C.uintptr_t) any {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.objs[uintptr(h)].obj
}

// handleEntry is a handle's C memory and the object it stands for.
type handleEntry struct {
	mem unsafe.Pointer
	obj any
}

func device(h C.uintptr_t) (nvml.Device, nvml.Return) {
	d, ok := handles.get(h).(nvml.Device)
	if !ok {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	return d, nvml.SUCCESS
}

func gpuInstance(h C.uintptr_t) (nvml.GpuInstance, nvml.Return) {
	gi, ok := handles.get(h).(nvml.GpuInstance)
	if !ok {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	return gi, nvml.SUCCESS
}

func computeInstance(h C.uintptr_t) (nvml.ComputeInstance, nvml.Return) {
	ci, ok := handles.get(h).(nvml.ComputeInstance)
	if !ok {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	return ci, nvml.SUCCESS
}

func eventSet(h C.uintptr_t) (nvml.EventSet, nvml.Return) {
	es, ok := handles.get(h).(nvml.EventSet)
	if !ok {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	return es, nvml.SUCCESS
}

// putString copies s into a caller's buffer of length n, NUL-terminated.
func putString(buf *C.char, n C.uint, s string) nvml.Return {
	if buf == nil {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	if uint64(len(s))+1 > uint64(n) {
		return nvml.ERROR_INSUFFICIENT_SIZE
	}
	out := unsafe.Slice((*byte)(unsafe.Pointer(buf)), int(n))
	copy(out, s)
	out[len(s)] = 0
	return nvml.SUCCESS
}

// errorStrings are nvmlErrorString's answers, C strings that live as long
// as the process, as NVML's own do.
var errorStrings sync.Map

//export nvmlErrorString
func nvmlErrorString(r C.int) *C.char {
	if s, ok := errorStrings.Load(int(r)); ok {
		return s.(*C.char)
	}
	s, _ := errorStrings.LoadOrStore(int(r), C.CString(nvml.Return(r).Error()))
	return s.(*C.char)
}

//export nvmlInit_v2
func nvmlInit_v2() C.int { return C.int(initSession()) }

//export nvmlInit
func nvmlInit() C.int { return C.int(initSession()) }

//export nvmlInitWithFlags
func nvmlInitWithFlags(C.uint) C.int { return C.int(initSession()) }

//export nvmlShutdown
func nvmlShutdown() C.int { return C.int(shutdownSession()) }
