package gen

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestGeneratedDocsAreCurrent fails when a checked-in reference is not what
// `make generate-docs` writes now (values.yaml, a CRD or a flag changed).
func TestGeneratedDocsAreCurrent(t *testing.T) {
	root, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	files, err := Generate(ctx, root)
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range Paths() {
		have, err := os.ReadFile(filepath.Join(root, path))
		if err != nil {
			t.Errorf("%s: %v (run make generate-docs)", path, err)
			continue
		}
		if !bytes.Equal(have, files[path]) {
			t.Errorf("%s is stale: run make generate-docs\n%s", path, firstDiff(string(have), string(files[path])))
		}
	}
}

func firstDiff(have, want string) string {
	h, w := strings.Split(have, "\n"), strings.Split(want, "\n")
	for i := 0; i < len(h) || i < len(w); i++ {
		var a, b string
		if i < len(h) {
			a = h[i]
		}
		if i < len(w) {
			b = w[i]
		}
		if a != b {
			return fmt.Sprintf("line %d:\n  have: %s\n  want: %s", i+1, a, b)
		}
	}
	return ""
}
