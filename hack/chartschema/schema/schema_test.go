package schema

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// Issue 12 item 14: the chart's schema left gpuProfiles and tenantQuotas
// untyped, so a typo in a catalog entry passed helm install and the API
// server pruned it. The file must hold the CRDs' current spec schemas.
func TestValuesSchemaIsCurrent(t *testing.T) {
	path := filepath.Join("..", "..", "..", ValuesSchemaPath)
	have, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want, err := Generate(have)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(have, want) {
		t.Fatalf("%s is not current: run go run ./hack/chartschema (make generate)", ValuesSchemaPath)
	}
}
