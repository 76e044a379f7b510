package cli

import (
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/gpuaas/gpu-dra-driver/pkg/version"
)

// Issue 12 item 14, issue 40: the release build sets the version and the
// commit with -ldflags -X (hack/version.sh); a binary built that way prints
// them, with the Go version, on --version.
func TestVersionIsSetAtBuildTime(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "versioned")
	ldflags := "-X " + version.Package + ".version=9.8.7-2-gabcdef1 -X " + version.Package + ".commit=abcdef1234567890"
	build := exec.Command("go", "build", "-o", bin, "-ldflags", ldflags, "./testdata/versioned")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("--version: %v\n%s", err, out)
	}
	want := regexp.MustCompile(`^versioned 9\.8\.7-2-gabcdef1 \(commit abcdef1234567890, go[0-9.]+\S* linux/\w+\)$`)
	if got := strings.TrimSpace(string(out)); !want.MatchString(got) {
		t.Fatalf("--version printed %q, want %v", got, want)
	}
}
