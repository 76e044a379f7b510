// Command chartschema types the chart's catalog values: it copies the spec
// schema of the GpuProfile and TenantQuota CRDs (config/crd) into
// values.schema.json, under gpuProfiles and tenantQuotas, so a typo in a
// catalog entry fails at helm install instead of being pruned by the API
// server. `make generate` runs it; a test checks the file is current.
//
//	go run ./hack/chartschema [-check]
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"

	"github.com/gpuaas/gpu-dra-driver/hack/chartschema/schema"
)

func main() {
	check := flag.Bool("check", false, "Only report whether the file is current.")
	flag.Parse()
	if err := run(*check); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func run(check bool) error {
	have, err := os.ReadFile(schema.ValuesSchemaPath)
	if err != nil {
		return fmt.Errorf("reading %s: %w", schema.ValuesSchemaPath, err)
	}
	want, err := schema.Generate(have)
	if err != nil {
		return err
	}
	if check {
		if !bytes.Equal(have, want) {
			return fmt.Errorf("%s is not current: run go run ./hack/chartschema", schema.ValuesSchemaPath)
		}
		return nil
	}
	return os.WriteFile(schema.ValuesSchemaPath, want, 0o644)
}
