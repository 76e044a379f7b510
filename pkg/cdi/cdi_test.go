package cdi

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"
	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpuaas/gpu-dra-driver/pkg/cdi/cditest"
	"github.com/gpuaas/gpu-dra-driver/pkg/mig"
)

// mockDriverVersion is what dgxh100's SystemGetDriverVersion reports.
const mockDriverVersion = "550.54.15"

const claimUID = "4b1c7d3e-9f2a-4e6b-8c1d-2a3b4c5d6e7f"

func twoGPUs() []Device {
	return []Device{
		{Name: "gpu-3", UUID: "GPU-aaaa", Minor: 3},
		{Name: "gpu-5", UUID: "GPU-bbbb", Minor: 5, Env: map[string]string{"CUDA_MPS_PIPE_DIRECTORY": "/mps/pipe"}},
	}
}

// newHandler returns a handler over a fresh CDI root and the dgxh100 mock.
func newHandler(t testing.TB, driverRoot string, mutate ...func(*Options)) (*Handler, string) {
	t.Helper()
	opts := Options{
		CDIRoot:    filepath.Join(t.TempDir(), "cdi"),
		DriverRoot: driverRoot,
		NVML:       dgxh100.New(),
		Logger:     logr.Discard(),
		// Tests of the hooks set a path; the others look at the rest.
		CDIHookPath: HooksDisabled,
	}
	for _, m := range mutate {
		m(&opts)
	}
	h, err := NewHandler(opts)
	if err != nil {
		t.Fatalf("NewHandler: %v", err)
	}
	return h, opts.CDIRoot
}

// readBack loads a claim's spec with the CDI library, which validates it the
// way a container runtime would.
func readBack(t *testing.T, cdiRoot, uid string) *cdiapi.Spec {
	t.Helper()
	spec, err := cdiapi.ReadSpec(SpecPath(cdiRoot, uid), 0)
	if err != nil {
		t.Fatalf("CDI library rejects the spec: %v", err)
	}
	return spec
}

func write(t *testing.T, h *Handler, uid string, devices []Device) map[string]string {
	t.Helper()
	ids, err := h.WriteClaimSpec(uid, devices)
	if err != nil {
		t.Fatalf("WriteClaimSpec: %v", err)
	}
	return ids
}

func TestSpecIsValidAndResolvable(t *testing.T) {
	root := cditest.NewDriverRoot(t, mockDriverVersion)
	h, cdiRoot := newHandler(t, root.Root)
	ids := write(t, h, claimUID, twoGPUs())

	spec := readBack(t, cdiRoot, claimUID)
	if spec.GetVendor() != Vendor || spec.GetClass() != Class {
		t.Errorf("kind = %s/%s, want %s", spec.GetVendor(), spec.GetClass(), Kind)
	}
	want, err := specs.MinimumRequiredVersion(spec.Spec)
	if err != nil || spec.Version != want {
		t.Errorf("cdiVersion = %q, want the minimum %q (%v)", spec.Version, want, err)
	}

	// A runtime resolves the IDs we return through a CDI cache.
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(cdiRoot), cdiapi.WithAutoRefresh(false))
	if err != nil {
		t.Fatalf("NewCache: %v", err)
	}
	if errs := cache.GetErrors(); len(errs) > 0 {
		t.Fatalf("CDI cache errors: %v", errs)
	}
	for name, id := range ids {
		if cache.GetDevice(id) == nil {
			t.Errorf("device %s: CDI cache does not resolve %q", name, id)
		}
	}
}

func TestDeviceIDs(t *testing.T) {
	h, _ := newHandler(t, "")
	ids := write(t, h, claimUID, twoGPUs())
	want := map[string]string{
		"gpu-3": "k8s.gpu.gpuaas.io/claim=" + claimUID + "-gpu-3",
		"gpu-5": "k8s.gpu.gpuaas.io/claim=" + claimUID + "-gpu-5",
	}
	if fmt.Sprint(ids) != fmt.Sprint(want) {
		t.Fatalf("ids = %v, want %v", ids, want)
	}
	for _, id := range ids {
		vendor, class, name, err := parser.ParseQualifiedName(id)
		if err != nil || vendor != Vendor || class != Class || !strings.HasPrefix(name, claimUID+"-") {
			t.Errorf("ParseQualifiedName(%q) = %q %q %q %v", id, vendor, class, name, err)
		}
	}
	if got := SpecPath("/var/run/cdi", claimUID); got != "/var/run/cdi/k8s.gpu.gpuaas.io-claim_"+claimUID+".json" {
		t.Errorf("SpecPath = %q", got)
	}
}

// Every spec sets NVIDIA_VISIBLE_DEVICES=void once, at spec level, so that
// specs of several claims merge to the same value; each device names itself
// in its own variable, at device level.
func TestVisibleDevicesIsVoidAndEachDeviceNamesItself(t *testing.T) {
	root := cditest.NewDriverRoot(t, mockDriverVersion)
	h, cdiRoot := newHandler(t, root.Root)
	devices := twoGPUs()
	write(t, h, claimUID, devices)
	spec := readBack(t, cdiRoot, claimUID)

	if got := envValues(spec.ContainerEdits.Env, visibleDevicesEnv); !slices.Equal(got, []string{"void"}) {
		t.Errorf("spec-level %s = %q, want exactly one void", visibleDevicesEnv, got)
	}
	for i, d := range spec.Devices {
		env := d.ContainerEdits.Env
		if v := envValues(env, visibleDevicesEnv); len(v) > 0 {
			t.Errorf("device %s sets %s=%v", d.Name, visibleDevicesEnv, v)
		}
		if v := envValues(env, deviceEnvName(devices[i].Name)); !slices.Equal(v, []string{devices[i].UUID}) {
			t.Errorf("device %s: %s = %v, want %s", d.Name, deviceEnvName(devices[i].Name), v, devices[i].UUID)
		}
		for k, want := range devices[i].Env {
			if v := envValues(env, k); !slices.Equal(v, []string{want}) {
				t.Errorf("device %s: %s = %v, want its extra env %s", d.Name, k, v, want)
			}
		}
	}
}

func TestDeviceEnvName(t *testing.T) {
	for name, want := range map[string]string{
		"gpu-3":              "GPUAAS_DEVICE_GPU_3",
		"gpu-2-mig-1g10gb-6": "GPUAAS_DEVICE_GPU_2_MIG_1G10GB_6",
		"gpu-0-ts.1":         "GPUAAS_DEVICE_GPU_0_TS_1",
	} {
		if got := deviceEnvName(name); got != want {
			t.Errorf("deviceEnvName(%q) = %q, want %q", name, got, want)
		}
	}
}

func envValues(env []string, key string) []string {
	var vals []string
	for _, e := range env {
		if v, ok := strings.CutPrefix(e, key+"="); ok {
			vals = append(vals, v)
		}
	}
	return vals
}

// makeNodes creates the nodes (plain files will do: only their existence is
// checked) under a dev root.
func makeNodes(t *testing.T, devRoot string, paths ...string) {
	t.Helper()
	for _, p := range paths {
		full := filepath.Join(devRoot, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, nil, 0o666); err != nil {
			t.Fatal(err)
		}
	}
}

// writeProcDevices writes a fake /proc/devices with nvidia-caps at major.
func writeProcDevices(t *testing.T, major int) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "devices")
	content := fmt.Sprintf("Character devices:\n195 nvidia\n%d nvidia-caps\n\nBlock devices:\n  7 loop\n", major)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestDeviceNodes(t *testing.T) {
	devRoot := t.TempDir()
	makeNodes(t, devRoot, "/dev/nvidia3", "/dev/nvidia5")
	const capsMajor = 237
	h, cdiRoot := newHandler(t, "", func(o *Options) { o.DevRoot = devRoot; o.ProcDevicesPath = writeProcDevices(t, capsMajor) })
	devices := twoGPUs()
	devices[0].ExtraNodes = []mig.CapNode{{Path: "/dev/nvidia-caps/nvidia-cap21", Minor: 21}, {Path: "/dev/nvidia-caps/nvidia-cap22", Minor: 22}}
	write(t, h, claimUID, devices)
	spec := readBack(t, cdiRoot, claimUID)

	wantPaths := [][]string{{"/dev/nvidia3", "/dev/nvidia-caps/nvidia-cap21", "/dev/nvidia-caps/nvidia-cap22"}, {"/dev/nvidia5"}}
	for i, d := range spec.Devices {
		if got := nodePaths(d.ContainerEdits.DeviceNodes); !slices.Equal(got, wantPaths[i]) {
			t.Errorf("device %s nodes = %v, want %v", d.Name, got, wantPaths[i])
		}
		for _, n := range d.ContainerEdits.DeviceNodes {
			if n.HostPath != filepath.Join(devRoot, n.Path) {
				t.Errorf("node %+v: want the host path under dev root %s", *n, devRoot)
			}
			if caps := strings.HasPrefix(n.Path, "/dev/nvidia-caps/"); caps {
				minor := slices.IndexFunc(devices[0].ExtraNodes, func(c mig.CapNode) bool { return c.Path == n.Path })
				if n.Type != "c" || n.Major != capsMajor || minor < 0 || n.Minor != int64(devices[0].ExtraNodes[minor].Minor) || n.FileMode == nil {
					t.Errorf("capability node %+v: want a full character device, major %d, its minor, a mode", *n, capsMajor)
				}
			} else if n.Type != "" || n.Major != 0 {
				t.Errorf("node %+v: want path only, the runtime reads the rest from the host's node", *n)
			}
		}
	}
}

// A MIG device whose capability minors are known but whose driver lists no
// nvidia-caps major cannot be given to a container: the write fails.
func TestCapNodesWithoutCapsMajorFail(t *testing.T) {
	path := filepath.Join(t.TempDir(), "devices")
	if err := os.WriteFile(path, []byte("Character devices:\n195 nvidia\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	h, cdiRoot := newHandler(t, "", func(o *Options) { o.ProcDevicesPath = path })
	devices := twoGPUs()
	devices[0].ExtraNodes = []mig.CapNode{{Path: "/dev/nvidia-caps/nvidia-cap21", Minor: 21}}
	if _, err := h.WriteClaimSpec(claimUID, devices); err == nil || !strings.Contains(err.Error(), "nvidia-caps") {
		t.Fatalf("WriteClaimSpec: error %v, want one naming nvidia-caps", err)
	}
	if entries := dirNames(t, cdiRoot); len(entries) > 0 {
		t.Errorf("CDI root holds %v after a failed write", entries)
	}
}

func nodePaths(nodes []*specs.DeviceNode) []string {
	var paths []string
	for _, n := range nodes {
		paths = append(paths, n.Path)
	}
	return paths
}

func TestFakeDriverRootYieldsDriverMounts(t *testing.T) {
	root := cditest.NewDriverRoot(t, mockDriverVersion)
	h, cdiRoot := newHandler(t, root.Root)
	write(t, h, claimUID, twoGPUs())
	edits := readBack(t, cdiRoot, claimUID).ContainerEdits

	mounts := map[string]string{}
	for _, m := range edits.Mounts {
		mounts[m.ContainerPath] = m.HostPath
	}
	for _, p := range []string{
		root.LibPath("libcuda.so"),
		root.LibPath("libnvidia-ml.so"),
		root.LibPath("libnvidia-ptxjitcompiler.so"),
		"/usr/bin/nvidia-smi",
	} {
		if mounts[p] != root.HostPath(p) {
			t.Errorf("mount of %s = %q, want from %q; mounts: %v", p, mounts[p], root.HostPath(p), mounts)
		}
	}
	if len(edits.Hooks) != 0 {
		t.Errorf("hooks though disabled: %v", edits.Hooks)
	}
	if got := nodePaths(edits.DeviceNodes); !slices.Equal(got, controlNodePaths()) {
		t.Errorf("spec-level nodes = %v, want %v", got, controlNodePaths())
	}
	if v := envValues(edits.Env, "NVIDIA_CTK_LIBCUDA_DIR"); !slices.Equal(v, []string{cditest.LibDir}) {
		t.Errorf("NVIDIA_CTK_LIBCUDA_DIR = %v, want %s", v, cditest.LibDir)
	}
}

func TestHooksUseConfiguredHookPath(t *testing.T) {
	root := cditest.NewDriverRoot(t, mockDriverVersion)
	const hook = "/usr/local/nvidia/toolkit/nvidia-cdi-hook"
	h, cdiRoot := newHandler(t, root.Root, func(o *Options) { o.CDIHookPath = hook })
	write(t, h, claimUID, twoGPUs())
	hooks := readBack(t, cdiRoot, claimUID).ContainerEdits.Hooks

	var names []string
	for _, hk := range hooks {
		if hk.Path != hook {
			t.Errorf("hook %v runs %q, want %q", hk.Args, hk.Path, hook)
		}
		if len(hk.Args) > 1 {
			names = append(names, hk.Args[1])
		}
	}
	if !slices.Contains(names, "update-ldcache") {
		t.Errorf("hooks %v lack update-ldcache", names)
	}
}

// With a driver installed and no hook to run, NewHandler refuses: specs
// without the hook's ldcache update gave containers libcuda.so.535.261.03
// but no libcuda.so.1, so CUDA could not load in any of them.
func TestDriverWithoutHookIsRefused(t *testing.T) {
	root := cditest.NewDriverRoot(t, mockDriverVersion)
	_, err := NewHandler(Options{CDIRoot: filepath.Join(t.TempDir(), "cdi"), DriverRoot: root.Root, NVML: dgxh100.New(), Logger: logr.Discard()})
	if err == nil || !strings.Contains(err.Error(), HookBinary) || !strings.Contains(err.Error(), "libcuda.so.1") {
		t.Fatalf("NewHandler without a hook path = %v, want an error naming %s and libcuda.so.1", err, HookBinary)
	}
	// Without a driver there is nothing for the hook to do.
	if _, err := NewHandler(Options{CDIRoot: filepath.Join(t.TempDir(), "cdi"), DriverRoot: t.TempDir(), NVML: dgxh100.New(), Logger: logr.Discard()}); err != nil {
		t.Fatalf("NewHandler without a driver or a hook: %v", err)
	}
}

// InstallHook puts the image's hook where the host's runtime can run it,
// executable, and leaves an identical one alone.
func TestInstallHook(t *testing.T) {
	src := filepath.Join(t.TempDir(), HookBinary)
	if err := os.WriteFile(src, []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	path, err := InstallHook(src, dir)
	if err != nil {
		t.Fatal(err)
	}
	info, err := os.Stat(path)
	if err != nil || info.Mode().Perm() != 0o755 || filepath.Dir(path) != filepath.Join(dir, "bin") {
		t.Fatalf("installed hook %s: %v, %v", path, info, err)
	}
	before := info.ModTime()
	if again, err := InstallHook(src, dir); err != nil || again != path {
		t.Fatalf("second install: %s, %v", again, err)
	}
	if info, _ := os.Stat(path); !info.ModTime().Equal(before) {
		t.Errorf("an identical hook was rewritten")
	}
	if _, err := InstallHook(filepath.Join(t.TempDir(), "missing"), dir); err == nil {
		t.Errorf("installing a missing hook succeeded")
	}
}

func TestNoDriverYieldsNodesAndEnvOnly(t *testing.T) {
	cases := map[string]func(t *testing.T, o *Options){
		"no driver root":    func(t *testing.T, o *Options) { o.DriverRoot = "" },
		"empty driver root": func(t *testing.T, o *Options) { o.DriverRoot = t.TempDir() },
		"other version":     func(t *testing.T, o *Options) { o.DriverRoot = cditest.NewDriverRoot(t, "535.1.2").Root },
		"no NVML": func(t *testing.T, o *Options) {
			o.DriverRoot = cditest.NewDriverRoot(t, mockDriverVersion).Root
			o.NVML = nil
		},
		"host root (no GPU)": func(t *testing.T, o *Options) { o.DriverRoot = "/" },
	}
	for name, setup := range cases {
		t.Run(name, func(t *testing.T) {
			var logged []string
			log := funcr.New(func(_, args string) { logged = append(logged, args) }, funcr.Options{Verbosity: 1})
			h, cdiRoot := newHandler(t, "", func(o *Options) { setup(t, o); o.Logger = log })
			if name == "host root (no GPU)" && len(h.driver.Load().common.Mounts) > 0 {
				t.Skip("this host has an NVIDIA driver")
			}
			write(t, h, claimUID, twoGPUs())
			edits := readBack(t, cdiRoot, claimUID).ContainerEdits

			if len(edits.Mounts)+len(edits.Hooks) > 0 {
				t.Errorf("driver files without a driver: mounts %v hooks %v", edits.Mounts, edits.Hooks)
			}
			if !slices.Equal(edits.Env, []string{"NVIDIA_VISIBLE_DEVICES=void"}) {
				t.Errorf("env = %v", edits.Env)
			}
			// Without a driver root nothing can be checked; with one, the
			// nodes it has are named and the others left out.
			var want []string
			for _, p := range controlNodePaths() {
				if h.driver.Load().nodes.localRoot == "" || fileExists(filepath.Join(h.driver.Load().nodes.localRoot, p)) {
					want = append(want, p)
				}
			}
			if got := nodePaths(edits.DeviceNodes); !slices.Equal(got, want) {
				t.Errorf("spec-level nodes = %v, want %v", got, want)
			}
			if n := countContaining(logged, "No driver files"); n != 1 {
				t.Errorf("logged the fallback %d times, want once: %v", n, logged)
			}
		})
	}
}

func controlNodePaths() []string {
	var out []string
	for _, n := range controlNodes {
		out = append(out, n.path)
	}
	return out
}

func fileExists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

func countContaining(lines []string, s string) int {
	n := 0
	for _, l := range lines {
		if strings.Contains(l, s) {
			n++
		}
	}
	return n
}

func TestRewriteIsAtomicAndIdempotent(t *testing.T) {
	h, cdiRoot := newHandler(t, cditest.NewDriverRoot(t, mockDriverVersion).Root)
	path := SpecPath(cdiRoot, claimUID)

	write(t, h, claimUID, twoGPUs()[:1])
	write(t, h, claimUID, twoGPUs())
	first := readFile(t, path)
	write(t, h, claimUID, twoGPUs())
	if second := readFile(t, path); second != first {
		t.Errorf("rewriting the same claim changed the file:\n%s\n%s", first, second)
	}
	if n := len(readBack(t, cdiRoot, claimUID).Devices); n != 2 {
		t.Errorf("rewritten spec has %d devices, want 2", n)
	}
	if entries := dirNames(t, cdiRoot); !slices.Equal(entries, []string{filepath.Base(path)}) {
		t.Errorf("CDI root holds %v, want only the spec (no temp files)", entries)
	}
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != specFileMode {
		t.Errorf("spec mode = %v (%v), want %v", st.Mode().Perm(), err, os.FileMode(specFileMode))
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

func TestInvalidInputWritesNothing(t *testing.T) {
	h, cdiRoot := newHandler(t, "")
	cases := map[string]struct {
		uid     string
		devices []Device
	}{
		"empty uid":        {"", twoGPUs()},
		"path in uid":      {"../etc", twoGPUs()},
		"slash in uid":     {"a/b", twoGPUs()},
		"no devices":       {claimUID, nil},
		"duplicate device": {claimUID, append(twoGPUs(), twoGPUs()[0])},
		"bad device name":  {claimUID, []Device{{Name: "gpu/3", UUID: "GPU-x"}}},
		"bad env":          {claimUID, []Device{{Name: "gpu-3", UUID: "GPU-x", Env: map[string]string{"": "x"}}}},
		"no UUID":          {claimUID, []Device{{Name: "gpu-3"}}},
		"negative minor":   {claimUID, []Device{{Name: "gpu-3", UUID: "GPU-x", Minor: -1}}},
		"relative node":    {claimUID, []Device{{Name: "gpu-3", UUID: "GPU-x", ExtraNodes: []mig.CapNode{{Path: "dev/x", Minor: 1}}}}},
		"relative mount":   {claimUID, []Device{{Name: "gpu-3", UUID: "GPU-x", Mounts: []Mount{{HostPath: "mps", ContainerPath: "/mps"}}}}},
		"device-level NVD": {claimUID, []Device{{Name: "gpu-3", UUID: "GPU-x", Env: map[string]string{visibleDevicesEnv: "all"}}}},
		"device env name":  {claimUID, []Device{{Name: "gpu-3", UUID: "GPU-x", Env: map[string]string{deviceEnvName("gpu-4"): "GPU-y"}}}},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			if _, err := h.WriteClaimSpec(c.uid, c.devices); err == nil {
				t.Fatal("want an error")
			}
			if entries := dirNames(t, cdiRoot); len(entries) > 0 {
				t.Errorf("CDI root holds %v after a failed write", entries)
			}
		})
	}
}

func TestDeleteIsIdempotent(t *testing.T) {
	h, cdiRoot := newHandler(t, "")
	write(t, h, claimUID, twoGPUs())
	for i := range 2 {
		if err := h.DeleteClaimSpec(claimUID); err != nil {
			t.Fatalf("delete #%d: %v", i+1, err)
		}
	}
	if _, err := os.Stat(SpecPath(cdiRoot, claimUID)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("spec still there: %v", err)
	}
	if err := h.DeleteClaimSpec("../x"); err == nil {
		t.Error("delete with a path as UID: want an error")
	}
}

func TestClaimSpecUIDsIgnoresForeignFiles(t *testing.T) {
	h, cdiRoot := newHandler(t, "")
	for _, uid := range []string{"uid-b", "uid-a"} {
		write(t, h, uid, twoGPUs())
	}
	for _, name := range []string{
		"nvidia.com-gpu.yaml",
		"k8s.gpu.gpuaas.io-other_uid-c.json",
		"k8s.gpu.gpuaas.io-claim_uid-d.yaml",
		".k8s.gpu.gpuaas.io-claim_uid-e.json.tmp123",
		"k8s.gpu.gpuaas.io-claim_.json",
	} {
		if err := os.WriteFile(filepath.Join(cdiRoot, name), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(cdiRoot, "k8s.gpu.gpuaas.io-claim_uid-f.json"), 0o755); err != nil {
		t.Fatal(err)
	}

	uids, err := h.ClaimSpecUIDs()
	if err != nil || !slices.Equal(uids, []string{"uid-a", "uid-b"}) {
		t.Fatalf("ClaimSpecUIDs = %v, %v; want [uid-a uid-b]", uids, err)
	}
	if err := os.RemoveAll(cdiRoot); err != nil {
		t.Fatal(err)
	}
	if uids, err := h.ClaimSpecUIDs(); err != nil || len(uids) != 0 {
		t.Errorf("missing CDI root: %v, %v; want none", uids, err)
	}
}

func TestNewHandlerRemovesStaleTempFiles(t *testing.T) {
	cdiRoot := t.TempDir()
	stale := "." + specFileName(claimUID) + tempInfix + "4242"
	foreign := ".nvidia.com-gpu.json.tmp1"
	for _, name := range []string{stale, foreign} {
		if err := os.WriteFile(filepath.Join(cdiRoot, name), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := NewHandler(Options{CDIRoot: cdiRoot, Logger: logr.Discard()}); err != nil {
		t.Fatal(err)
	}
	if got := dirNames(t, cdiRoot); !slices.Equal(got, []string{foreign}) {
		t.Errorf("CDI root holds %v, want only %s", got, foreign)
	}
}

func TestConcurrentWrites(t *testing.T) {
	h, cdiRoot := newHandler(t, cditest.NewDriverRoot(t, mockDriverVersion).Root)
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() {
			if _, err := h.WriteClaimSpec(fmt.Sprintf("claim-%d", i%8), twoGPUs()); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	uids, err := h.ClaimSpecUIDs()
	if err != nil || len(uids) != 8 {
		t.Fatalf("ClaimSpecUIDs = %v, %v; want 8 claims", uids, err)
	}
	for _, uid := range uids {
		readBack(t, cdiRoot, uid)
	}
}

func TestNewHandlerNeedsCDIRoot(t *testing.T) {
	if _, err := NewHandler(Options{}); err == nil {
		t.Fatal("want an error without a CDI root")
	}
}

// BenchmarkWriteClaimSpec measures one claim's spec write, fsyncs included.
// "tmpfs" is the realistic case: /var/run/cdi lives on tmpfs on most nodes,
// where fsync is free; "disk" shows the cost of the two fsyncs on a disk.
func BenchmarkWriteClaimSpec(b *testing.B) {
	dirs := map[string]func(b *testing.B) string{"disk": func(b *testing.B) string { return b.TempDir() }}
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		dirs["tmpfs"] = func(b *testing.B) string {
			dir, err := os.MkdirTemp("/dev/shm", "cdi-bench-")
			if err != nil {
				b.Skip(err)
			}
			b.Cleanup(func() { _ = os.RemoveAll(dir) })
			return dir
		}
	}
	for fs, dir := range dirs {
		for _, n := range []int{1, 8} {
			b.Run(fmt.Sprintf("%s/devices=%d", fs, n), func(b *testing.B) {
				benchmarkWrite(b, dir(b), n)
			})
		}
	}
}

func benchmarkWrite(b *testing.B, cdiRoot string, n int) {
	root := cditest.NewDriverRoot(b, mockDriverVersion)
	h, _ := newHandler(b, root.Root, func(o *Options) { o.CDIRoot = cdiRoot })
	devices := make([]Device, n)
	for i := range devices {
		devices[i] = Device{Name: fmt.Sprintf("gpu-%d", i), UUID: fmt.Sprintf("GPU-%d", i), Minor: i}
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if _, err := h.WriteClaimSpec(fmt.Sprintf("claim-%d", i%64), devices); err != nil {
			b.Fatal(err)
		}
	}
}

// hostPaths lists every host path a spec names: mounts, device nodes (the
// path itself when no host path is given) and hooks.
func hostPaths(spec *cdiapi.Spec) []string {
	var out []string
	add := func(e specs.ContainerEdits) {
		for _, m := range e.Mounts {
			out = append(out, m.HostPath)
		}
		for _, n := range e.DeviceNodes {
			out = append(out, cmp.Or(n.HostPath, n.Path))
		}
		for _, h := range e.Hooks {
			out = append(out, h.Path)
		}
	}
	add(spec.ContainerEdits)
	for _, d := range spec.Devices {
		add(d.ContainerEdits)
	}
	return out
}

// The chart mounts the driver root at a path of its own in the plugin's
// container (a host install "/" at /host), but the runtime reads the spec
// on the host: every host path must be the host's. Before HostDriverRoot
// the specs named /host/usr/lib/... and /host/dev/nvidia3, which do not
// exist on the host, and every GPU container failed.
func TestHostPathsAreOnTheHost(t *testing.T) {
	for _, hostRoot := range []string{"/", "/run/nvidia/driver"} {
		t.Run(hostRoot, func(t *testing.T) {
			inContainer := cditest.NewDriverRoot(t, mockDriverVersion) // what the plugin sees
			h, cdiRoot := newHandler(t, inContainer.Root, func(o *Options) { o.HostDriverRoot = hostRoot })
			write(t, h, claimUID, twoGPUs())
			paths := hostPaths(readBack(t, cdiRoot, claimUID))
			if len(paths) < 6 {
				t.Fatalf("spec names only %v", paths)
			}
			for _, p := range paths {
				if strings.HasPrefix(p, inContainer.Root) {
					t.Errorf("host path %s is the plugin's view of the driver root", p)
				}
				if !strings.HasPrefix(p, hostRoot) {
					t.Errorf("host path %s is not under the host's driver root %s", p, hostRoot)
				}
			}
			want := []string{filepath.Join(hostRoot, inContainer.LibPath("libcuda.so")), filepath.Join(hostRoot, "/dev/nvidia3"), filepath.Join(hostRoot, "/dev/nvidiactl")}
			for _, w := range want {
				if !slices.Contains(paths, w) {
					t.Errorf("spec does not name %s; it names %v", w, paths)
				}
			}
		})
	}
}
