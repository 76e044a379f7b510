package docs

import (
	"bufio"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// removedAPIs matches a use of an API version of resource.k8s.io that a
// supported Kubernetes version no longer serves: v1beta1 is gone in 1.38
// (issue 57), so nothing the project ships or tells a user to run may name
// it: not as apiVersion, not as a Go import, not as a typed client.
var removedAPIs = regexp.MustCompile(`resource\.k8s\.io/v1beta1\b|k8s\.io/api/resource/v1beta1\b|\bResourceV1beta1\(`)

// historyFiles record what was, not what is: they may name removed APIs.
var historyFiles = map[string]bool{"CHANGELOG.md": true, "test/docs/apiversions_test.go": true}

// TestNothingUsesRemovedResourceAPIs scans the code, the chart, the demo,
// the docs and the scripts for resource.k8s.io/v1beta1.
func TestNothingUsesRemovedResourceAPIs(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	scanned := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			if name := d.Name(); name == ".git" || name == "_output" || name == "node_modules" {
				return filepath.SkipDir
			}
			return nil
		}
		if historyFiles[filepath.ToSlash(rel)] || !scannedFile(d.Name()) {
			return nil
		}
		scanned++
		for n, line := range fileLines(t, path) {
			if removedAPIs.MatchString(line) {
				t.Errorf("%s:%d uses an API Kubernetes 1.38 no longer serves (resource.k8s.io/v1beta1; use v1): %s", rel, n+1, strings.TrimSpace(line))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if scanned < 100 {
		t.Fatalf("scanned %d files under %s: not the repository", scanned, root)
	}
}

// TestRemovedAPIMatcher: the scan is not blind.
func TestRemovedAPIMatcher(t *testing.T) {
	for _, s := range []string{"apiVersion: resource.k8s.io/v1beta1", `resourcev1beta1 "k8s.io/api/resource/v1beta1"`,
		"cs.ResourceV1beta1().ResourceSlices()"} {
		if !removedAPIs.MatchString(s) {
			t.Errorf("%q is not caught", s)
		}
	}
	for _, s := range []string{"apiVersion: resource.k8s.io/v1", "resource.k8s.io/v1beta2/devicetaintrules=true", "cs.ResourceV1()"} {
		if removedAPIs.MatchString(s) {
			t.Errorf("%q is caught, but is served", s)
		}
	}
}

func scannedFile(name string) bool {
	switch filepath.Ext(name) {
	case ".go", ".yaml", ".yml", ".md", ".tpl", ".json", ".sh", ".mk", ".txt", ".toml":
		return true
	}
	return name == "Makefile" || name == "Dockerfile"
}

func fileLines(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64*1024), 16*1024*1024)
	for sc.Scan() {
		out = append(out, sc.Text())
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("reading %s: %v", path, err)
	}
	return out
}
