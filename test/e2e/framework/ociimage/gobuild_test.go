package ociimage

import (
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// A static glibc binary segfaults in dlopen of the real libnvidia-ml, so
// StaticBinary must refuse cgo before it builds anything.
func TestStaticBinaryRefusesCgo(t *testing.T) {
	err := StaticBinary(context.Background(), repoRoot(t), "cmd/dra-kubelet-plugin", filepath.Join(t.TempDir(), "x"), true)
	if !errors.Is(err, errStaticCgo) || !strings.Contains(err.Error(), "dlopen") {
		t.Errorf("StaticBinary with cgo: err = %v, want %v", err, errStaticCgo)
	}
}

// TestDynamicBinary builds the version test command of pkg/cli with its
// Version variable set, and runs it.
func TestDynamicBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a binary")
	}
	if runtime.GOOS != "linux" || runtime.GOARCH != "amd64" {
		t.Skip("images are linux/amd64")
	}
	out := filepath.Join(t.TempDir(), "versioned")
	vars := map[string]string{"github.com/gpuaas/gpu-dra-driver/pkg/version.version": "9.8.7-test"}
	if err := DynamicBinary(context.Background(), repoRoot(t), "pkg/cli/testdata/versioned", out, vars); err != nil {
		t.Fatal(err)
	}
	got, err := exec.Command(out, "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("--version: %v\n%s", err, got)
	}
	if !strings.HasPrefix(string(got), "versioned 9.8.7-test (commit ") {
		t.Errorf("--version printed %q, want versioned 9.8.7-test (commit ...)", got)
	}
}

func TestLdflagsWithVars(t *testing.T) {
	got, err := ldflagsWithVars([]string{"-s", "-w"}, map[string]string{"b.V": "2", "a.V": "1"})
	if want := "-s -w -X a.V=1 -X b.V=2"; err != nil || got != want {
		t.Errorf("ldflagsWithVars = %q, %v; want %q", got, err, want)
	}
	for _, vars := range []map[string]string{{"a.V": "1 2"}, {"a.V": `"x"`}, {"": "1"}} {
		if got, err := ldflagsWithVars(nil, vars); err == nil {
			t.Errorf("ldflagsWithVars(%v) = %q, want an error", vars, got)
		}
	}
}
