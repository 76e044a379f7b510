// Package schema puts the CRDs' spec schemas into the chart's
// values.schema.json (see hack/chartschema).
package schema

import (
	"encoding/json"
	"fmt"

	"sigs.k8s.io/yaml"

	"github.com/gpuaas/gpu-dra-driver/config/crd"
)

// ValuesSchemaPath is the chart's values schema, relative to the
// repository root.
const ValuesSchemaPath = "deployments/helm/gpuaas-dra/values.schema.json"

// catalog maps each values key to the CRD whose spec its entries are.
var catalog = map[string]string{
	"gpuProfiles":  "gpuaas.io_gpuprofiles.yaml",
	"tenantQuotas": "gpuaas.io_tenantquotas.yaml",
}

// Generate returns values (a values.schema.json) with each catalog key's
// entries typed by their CRD's spec schema.
func Generate(values []byte) ([]byte, error) {
	var doc map[string]any
	if err := json.Unmarshal(values, &doc); err != nil {
		return nil, fmt.Errorf("decoding values schema: %w", err)
	}
	props, ok := doc["properties"].(map[string]any)
	if !ok {
		return nil, fmt.Errorf("values schema has no properties")
	}
	for key, file := range catalog {
		spec, err := specSchema(file)
		if err != nil {
			return nil, err
		}
		entry, ok := props[key].(map[string]any)
		if !ok {
			return nil, fmt.Errorf("values schema has no %s", key)
		}
		entry["additionalProperties"] = spec
	}
	out, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encoding values schema: %w", err)
	}
	return append(out, '\n'), nil
}

// specSchema is the CRD's spec schema (first version), closed: JSON
// Schema would accept unknown fields that the API server prunes.
func specSchema(file string) (map[string]any, error) {
	raw, err := crd.Files.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("reading CRD %s: %w", file, err)
	}
	var c struct {
		Spec struct {
			Versions []struct {
				Schema struct {
					OpenAPIV3Schema struct {
						Properties map[string]map[string]any `json:"properties"`
					} `json:"openAPIV3Schema"`
				} `json:"schema"`
			} `json:"versions"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(raw, &c); err != nil {
		return nil, fmt.Errorf("decoding CRD %s: %w", file, err)
	}
	if len(c.Spec.Versions) == 0 {
		return nil, fmt.Errorf("CRD %s has no versions", file)
	}
	spec := c.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["spec"]
	if spec == nil {
		return nil, fmt.Errorf("CRD %s has no spec schema", file)
	}
	closeObjects(spec)
	return spec, nil
}

// closeObjects forbids unknown properties in every object schema that
// lists its properties, and drops Kubernetes' CEL rules, which JSON Schema
// cannot evaluate (the API server still does).
func closeObjects(s map[string]any) {
	delete(s, "x-kubernetes-validations")
	if props, ok := s["properties"].(map[string]any); ok {
		if _, set := s["additionalProperties"]; !set && s["x-kubernetes-preserve-unknown-fields"] != true {
			s["additionalProperties"] = false
		}
		for _, p := range props {
			if pm, ok := p.(map[string]any); ok {
				closeObjects(pm)
			}
		}
	}
	for _, key := range []string{"items", "additionalProperties"} {
		if sub, ok := s[key].(map[string]any); ok {
			closeObjects(sub)
		}
	}
}
