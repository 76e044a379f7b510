//go:build cgo

package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// runMainEnv makes the test binary run gpuinfo's main instead of the tests,
// so a test can run the whole program in a process whose loader
// environment (LD_LIBRARY_PATH, read only at process start) it chose.
const runMainEnv = "GPUINFO_TEST_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestCUDAProbe runs gpuinfo against fake driver libraries, built here the
// way the real ones are named (versioned file, soname link), and a fake
// nvidia-smi, and checks the whole report.
func TestCUDAProbe(t *testing.T) {
	driver := buildFakeDriver(t)
	noCuInit := buildFakeDriver(t, "-DNO_CUINIT")
	smiDir := filepath.Dir(writeNvidiaSMI(t, "#!/bin/sh\necho\necho \""+smiFailure+"\"\nexit 9\n"))
	empty := realTempDir(t)
	for _, tc := range []struct {
		name string
		args []string
		env  []string
		want []string
	}{{
		name: "no kernel module",
		env:  []string{"LD_LIBRARY_PATH=" + driver, "PATH=" + smiDir},
		want: []string{
			"cuda libcuda.so.1 cuInit=100",
			"cuda libcuda.so.1 path=" + driver + "/libcuda.so.100.0",
			"cuda libnvidia-ml.so.1 nvmlInit=9",
			"cuda libnvidia-ml.so.1 path=" + driver + "/libnvidia-ml.so.100.0",
			"nvidia-smi exit=9 " + smiFailure,
			doneLine,
		},
	}, {
		name: "nvml initializes",
		env:  []string{"LD_LIBRARY_PATH=" + driver, "PATH=" + empty, "GPUINFO_FAKE_NVML_INIT=0"},
		want: []string{
			"cuda libcuda.so.1 cuInit=100",
			"cuda libcuda.so.1 path=" + driver + "/libcuda.so.100.0",
			"cuda libnvidia-ml.so.1 nvmlInit=0",
			"cuda libnvidia-ml.so.1 nvmlShutdown=0",
			"cuda libnvidia-ml.so.1 path=" + driver + "/libnvidia-ml.so.100.0",
			"nvidia-smi not-found",
			doneLine,
		},
	}, {
		name: "no cuInit",
		env:  []string{"LD_LIBRARY_PATH=" + noCuInit, "PATH=" + empty},
		want: []string{
			"cuda libcuda.so.1 dlsym-error=" + noCuInit + "/libcuda.so.1: undefined symbol: cuInit",
			"cuda libcuda.so.1 path=" + noCuInit + "/libcuda.so.100.0",
			"cuda libnvidia-ml.so.1 nvmlInit=9",
			"cuda libnvidia-ml.so.1 path=" + noCuInit + "/libnvidia-ml.so.100.0",
			"nvidia-smi not-found",
			doneLine,
		},
	}, {
		name: "probe off",
		args: []string{"-cuda=false"},
		env:  []string{"LD_LIBRARY_PATH=" + driver, "PATH=" + smiDir},
		want: []string{doneLine},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			if got := runGpuinfo(t, tc.args, tc.env); !slices.Equal(got, tc.want) {
				t.Errorf("report:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
			}
		})
	}
}

// TestCUDAProbeNoDriver: where nothing provides the libraries, the report
// says why each did not load.
func TestCUDAProbeNoDriver(t *testing.T) {
	for _, soname := range []string{"libcuda.so.1", "libnvidia-ml.so.1"} {
		if hostLoads(soname) {
			t.Skipf("this host's ld.so.cache has %s: the loader finds it without LD_LIBRARY_PATH", soname)
		}
	}
	empty := realTempDir(t)
	want := []string{
		"cuda libcuda.so.1 dlopen-error=libcuda.so.1: cannot open shared object file: No such file or directory",
		"cuda libnvidia-ml.so.1 dlopen-error=libnvidia-ml.so.1: cannot open shared object file: No such file or directory",
		"nvidia-smi not-found",
		doneLine,
	}
	got := runGpuinfo(t, nil, []string{"LD_LIBRARY_PATH=" + empty, "PATH=" + empty})
	if !slices.Equal(got, want) {
		t.Errorf("report:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// runGpuinfo runs main with args in a new process with only env set, on a
// root whose dev and mountinfo contribute nothing, and returns the report.
func runGpuinfo(t *testing.T, args, env []string) []string {
	t.Helper()
	root := t.TempDir()
	mustMkdir(t, filepath.Join(root, "dev"))
	mustMkdir(t, filepath.Join(root, "proc", "self"))
	mountinfo := []byte("1 0 0:1 / / rw - overlay overlay rw\n")
	if err := os.WriteFile(filepath.Join(root, "proc", "self", "mountinfo"), mountinfo, 0o644); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self, append([]string{"-once", "-root", root}, args...)...)
	cmd.Env = append([]string{runMainEnv + "=1"}, env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("gpuinfo %q: %v\n%s", args, err, stderr.String())
	}
	// The probe's lines and the end; /dev/shm is another test's.
	return slices.DeleteFunc(strings.Split(strings.TrimSuffix(string(out), "\n"), "\n"),
		func(l string) bool { return strings.HasPrefix(l, "shm ") })
}

// buildFakeDriver compiles testdata's fake libcuda and libnvidia-ml with
// cflags into a new directory, as the driver installs them: a versioned
// file and a soname link to it. It returns the directory.
func buildFakeDriver(t *testing.T, cflags ...string) string {
	t.Helper()
	dir := realTempDir(t)
	for _, lib := range []struct{ src, soname string }{
		{"fakecuda.c", "libcuda.so.1"},
		{"fakenvml.c", "libnvidia-ml.so.1"},
	} {
		file := strings.TrimSuffix(lib.soname, ".1") + ".100.0"
		cc := cCompiler()
		args := append(cc[1:], "-shared", "-fPIC", "-Wl,-soname,"+lib.soname, "-o", filepath.Join(dir, file))
		args = append(append(args, cflags...), filepath.Join("testdata", lib.src))
		cmd := exec.Command(cc[0], args...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", cmd, err, out)
		}
		if err := os.Symlink(file, filepath.Join(dir, lib.soname)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// cCompiler is the compiler command cgo uses (CC may carry flags), so the
// fakes build wherever the package does.
func cCompiler() []string {
	if cc := strings.Fields(os.Getenv("CC")); len(cc) > 0 {
		return cc
	}
	return []string{"gcc"}
}

// hostLoads reports whether the host's ld.so.cache lists soname, as on a
// machine with the NVIDIA driver installed, where a process cannot be kept
// from finding the library.
func hostLoads(soname string) bool {
	cache, err := os.ReadFile("/etc/ld.so.cache")
	return err == nil && bytes.Contains(cache, []byte(soname+"\x00"))
}
