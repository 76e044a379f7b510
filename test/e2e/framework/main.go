package framework

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"

	"k8s.io/klog/v2"
)

// Binaries are the control-plane programs Start needs.
var Binaries = []string{"etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager"}

// RepoRoot finds the repository root by walking up from the working
// directory to the first go.mod (go test runs in the package directory).
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("getting working dir: %w", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory")
		}
		dir = parent
	}
}

// DefaultBinDir is $KUBE_BIN_DIR, or <repo>/_output/bin where
// hack/build-k8s-bins.sh puts the binaries.
func DefaultBinDir() (string, error) {
	if dir := os.Getenv("KUBE_BIN_DIR"); dir != "" {
		return dir, nil
	}
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	return filepath.Join(root, "_output", "bin"), nil
}

// MissingBinaries lists the control-plane binaries not found in dir.
func MissingBinaries(dir string) []string {
	var missing []string
	for _, name := range Binaries {
		if info, err := os.Stat(filepath.Join(dir, name)); err != nil || info.IsDir() {
			missing = append(missing, name)
		}
	}
	return missing
}

// Required reports whether e2e tests must run (E2E_REQUIRED=1, as under
// `make e2e`) rather than skip when the binaries are missing.
func Required() bool { return os.Getenv("E2E_REQUIRED") == "1" }

// Main is the body of a TestMain: it starts one control plane for the test
// package, calls setup (to build the plugin, say), runs the tests and stops
// everything. Without binaries it prints one line and skips the package,
// unless E2E_REQUIRED=1. When a test failed, the work dir with all logs is
// kept and the tails of the component logs are printed. It returns the exit
// code for os.Exit. E2E_KEEP=1 keeps the work dir of a passing run too.
func Main(m *testing.M, setup func(*ControlPlane) error) int {
	return MainWith(m, Options{Verbosity: 2}, setup)
}

// MainWith is Main with the control plane's options (BinDir and Progress
// are filled in).
func MainWith(m *testing.M, opts Options, setup func(*ControlPlane) error) int {
	binDir, err := DefaultBinDir()
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e: %v\n", err)
		return 1
	}
	if missing := MissingBinaries(binDir); len(missing) > 0 {
		if Required() {
			fmt.Fprintf(os.Stderr, "e2e: FAIL: control-plane binaries %v not found in %s; run hack/build-k8s-bins.sh\n", missing, binDir)
			return 1
		}
		fmt.Printf("e2e: skipped, control-plane binaries not found in %s; run `make e2e`\n", binDir)
		return 0
	}
	opts.BinDir, opts.Progress = binDir, os.Stderr
	if err := suiteVersion(&opts); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: %v\n", err)
		return 1
	}
	cp, err := Start(context.Background(), opts)
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e: starting control plane: %v\n", err)
		return 1
	}
	code := runWith(m, cp, setup)
	if err := cp.Stop(); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: stopping control plane: %v\n", err)
		code = max(code, 1)
	}
	if code != 0 {
		fmt.Fprintf(os.Stderr, "e2e: FAILED; logs kept in %s\n", cp.LogDir)
		cp.DumpLogs(os.Stderr, 20)
		return code
	}
	if os.Getenv("E2E_KEEP") == "1" {
		fmt.Fprintf(os.Stderr, "e2e: E2E_KEEP=1: work dir kept in %s\n", cp.Dir)
		return code
	}
	if err := cp.Cleanup(); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: %v\n", err)
	}
	return code
}

func runWith(m *testing.M, cp *ControlPlane, setup func(*ControlPlane) error) int {
	if setup != nil {
		if err := setup(cp); err != nil {
			fmt.Fprintf(os.Stderr, "e2e: setup: %v\n", err)
			return 1
		}
	}
	return m.Run()
}

// DumpLogs writes the last lines of every log under LogDir to w: the
// control plane's, and those of the nodes' plugins.
func (cp *ControlPlane) DumpLogs(w io.Writer, lines int) {
	klog.Flush()
	entries, err := os.ReadDir(cp.LogDir)
	if err != nil {
		_, _ = fmt.Fprintf(w, "e2e: reading %s: %v\n", cp.LogDir, err)
		return
	}
	for _, e := range entries {
		path := filepath.Join(cp.LogDir, e.Name())
		_, _ = fmt.Fprintf(w, "----- %s, last %d lines -----\n%s\n", path, lines, tailFile(path, lines))
	}
}
