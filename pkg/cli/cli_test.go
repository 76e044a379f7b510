package cli

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Issue 12 item 14: the Makefile's VERSION never reached the binaries. The
// image build sets Version with -ldflags -X; a binary built that way prints
// it with --version.
func TestVersionIsSetAtBuildTime(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "versioned")
	build := exec.Command("go", "build", "-o", bin,
		"-ldflags", "-X github.com/gpuaas/gpu-dra-driver/pkg/cli.Version=9.8.7", "./testdata/versioned")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("--version: %v\n%s", err, out)
	}
	if got := strings.TrimSpace(string(out)); got != "9.8.7" {
		t.Fatalf("--version printed %q, want 9.8.7", got)
	}
}
