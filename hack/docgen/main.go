// Command docgen writes the generated references of the docs: the chart's
// README with its values (from values.yaml's comments), docs/reference/crds.md
// (from config/crd) and docs/reference/flags.md (from both binaries' --help).
// Run from the repository root:
//
//	go run ./hack/docgen [-check]
//
// `make generate-docs` runs it; hack/docgen/gen's test fails when a
// checked-in file is not what it writes.
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/gpuaas/gpu-dra-driver/hack/docgen/gen"
)

func main() {
	check := flag.Bool("check", false, "Only report whether the files are current.")
	flag.Parse()
	if err := run(*check); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func run(check bool) error {
	files, err := gen.Generate(context.Background(), ".")
	if err != nil {
		return err
	}
	for _, path := range gen.Paths() {
		want := files[path]
		have, _ := os.ReadFile(path)
		if bytes.Equal(have, want) {
			continue
		}
		if check {
			return fmt.Errorf("%s is not current: run make generate-docs", path)
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(path, want, 0o644); err != nil {
			return err
		}
		fmt.Println("wrote", path)
	}
	return nil
}
