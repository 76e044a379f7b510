package monitoring

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// The chart's ServiceMonitor, PodMonitor and PrometheusRule are checked
// against the Prometheus Operator's CRDs (hack/build-prometheus.sh copies
// them from the operator's module at a pinned version): a field the CRD does
// not have would be pruned by the API server without a word, and a scrape
// setting silently lost. The check is the structural part of what the API
// server validates (fields, types, enums, required, patterns), without CEL.

// schema is the part of a CRD's OpenAPI v3 schema the check reads.
type schema struct {
	Type                 string             `json:"type"`
	Properties           map[string]*schema `json:"properties"`
	AdditionalProperties *schemaOrBool      `json:"additionalProperties"`
	Items                *schema            `json:"items"`
	Required             []string           `json:"required"`
	Enum                 []any              `json:"enum"`
	Pattern              string             `json:"pattern"`
	PreserveUnknown      bool               `json:"x-kubernetes-preserve-unknown-fields"`
	IntOrString          bool               `json:"x-kubernetes-int-or-string"`
}

// schemaOrBool is additionalProperties: a schema, or true/false.
type schemaOrBool struct {
	allowed bool
	schema  *schema
}

func (s *schemaOrBool) UnmarshalJSON(data []byte) error {
	if err := json.Unmarshal(data, &s.allowed); err == nil {
		return nil
	}
	s.allowed = true
	return json.Unmarshal(data, &s.schema)
}

type crd struct {
	Spec struct {
		Group string `json:"group"`
		Names struct {
			Kind string `json:"kind"`
		} `json:"names"`
		Versions []struct {
			Name   string `json:"name"`
			Schema struct {
				OpenAPIV3Schema *schema `json:"openAPIV3Schema"`
			} `json:"schema"`
		} `json:"versions"`
	} `json:"spec"`
}

// operatorCRDs returns the schemas by "group/version, Kind".
func operatorCRDs(t *testing.T) (map[string]*schema, string) {
	t.Helper()
	dir := filepath.Join(repoRoot(t), "_output", "prometheus-operator", "crds")
	paths, _ := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if len(paths) == 0 {
		if os.Getenv("E2E_REQUIRED") == "1" {
			t.Fatalf("no Prometheus Operator CRDs in %s (E2E_REQUIRED=1): run hack/build-prometheus.sh", dir)
		}
		t.Skipf("no Prometheus Operator CRDs in %s; run hack/build-prometheus.sh", dir)
	}
	version, _ := os.ReadFile(filepath.Join(dir, "VERSION"))
	out := map[string]*schema{}
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		var c crd
		if err := yaml.Unmarshal(data, &c); err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		for _, v := range c.Spec.Versions {
			out[c.Spec.Group+"/"+v.Name+", "+c.Spec.Names.Kind] = v.Schema.OpenAPIV3Schema
		}
	}
	return out, strings.TrimSpace(string(version))
}

// validate returns what of value s refuses, each with its path.
func validate(path string, value any, s *schema) []string {
	if s == nil {
		return nil
	}
	if s.IntOrString {
		switch value.(type) {
		case string, int64, float64:
			return nil
		}
		return []string{fmt.Sprintf("%s: %v is neither an integer nor a string", path, value)}
	}
	var problems []string
	if len(s.Enum) > 0 {
		found := false
		for _, e := range s.Enum {
			if fmt.Sprint(e) == fmt.Sprint(value) {
				found = true
			}
		}
		if !found {
			problems = append(problems, fmt.Sprintf("%s: %v is not one of %v", path, value, s.Enum))
		}
	}
	switch s.Type {
	case "object":
		m, ok := value.(map[string]any)
		if !ok {
			return append(problems, fmt.Sprintf("%s: want an object, got %T", path, value))
		}
		for _, r := range s.Required {
			if _, ok := m[r]; !ok {
				problems = append(problems, fmt.Sprintf("%s: %s is required", path, r))
			}
		}
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			switch {
			case s.Properties[k] != nil:
				problems = append(problems, validate(path+"."+k, m[k], s.Properties[k])...)
			case s.AdditionalProperties != nil && s.AdditionalProperties.allowed:
				problems = append(problems, validate(path+"."+k, m[k], s.AdditionalProperties.schema)...)
			case s.PreserveUnknown:
			default:
				problems = append(problems, fmt.Sprintf("%s: unknown field %q (the API server prunes it)", path, k))
			}
		}
	case "array":
		a, ok := value.([]any)
		if !ok {
			return append(problems, fmt.Sprintf("%s: want an array, got %T", path, value))
		}
		for i, v := range a {
			problems = append(problems, validate(fmt.Sprintf("%s[%d]", path, i), v, s.Items)...)
		}
	case "string":
		str, ok := value.(string)
		if !ok {
			return append(problems, fmt.Sprintf("%s: want a string, got %T (%v)", path, value, value))
		}
		if s.Pattern != "" {
			// Patterns RE2 cannot compile are left to the API server.
			if re, err := regexp.Compile(s.Pattern); err == nil && !re.MatchString(str) {
				problems = append(problems, fmt.Sprintf("%s: %q does not match %s", path, str, s.Pattern))
			}
		}
	case "integer":
		switch v := value.(type) {
		case int64:
		case float64:
			if v != float64(int64(v)) {
				problems = append(problems, fmt.Sprintf("%s: %v is not an integer", path, v))
			}
		default:
			problems = append(problems, fmt.Sprintf("%s: want an integer, got %T", path, value))
		}
	case "boolean":
		if _, ok := value.(bool); !ok {
			problems = append(problems, fmt.Sprintf("%s: want a boolean, got %T", path, value))
		}
	}
	return problems
}

// validateObject checks an object's spec against its CRD.
func validateObject(crds map[string]*schema, o *unstructured.Unstructured) ([]string, error) {
	s := crds[o.GetAPIVersion()+", "+o.GetKind()]
	if s == nil {
		return nil, fmt.Errorf("no CRD for %s %s", o.GetAPIVersion(), o.GetKind())
	}
	return validate(o.GetKind()+".spec", o.Object["spec"], s.Properties["spec"]), nil
}

// TestHelmMonitoringMatchesOperatorCRDs: every monitoring.coreos.com
// object the chart renders is valid under the Prometheus Operator's CRDs,
// in both network modes of the plugin; and the check does refuse a
// misspelled field and a wrong type (so it is not vacuous).
func TestHelmMonitoringMatchesOperatorCRDs(t *testing.T) {
	crds, version := operatorCRDs(t)
	for _, hostNetwork := range []string{"false", "true"} {
		objs := renderChart(t, append(append([]string{}, monitoringOn...), "kubeletPlugin.hostNetwork="+hostNetwork)...)
		n := 0
		for _, o := range objs {
			if !strings.HasPrefix(o.GetAPIVersion(), "monitoring.coreos.com/") {
				continue
			}
			n++
			problems, err := validateObject(crds, o)
			if err != nil {
				t.Error(err)
			}
			for _, p := range problems {
				t.Errorf("hostNetwork=%s: %s", hostNetwork, p)
			}
		}
		if n != 3 {
			t.Errorf("hostNetwork=%s: %d monitoring.coreos.com objects rendered, want 3", hostNetwork, n)
		}
		t.Logf("hostNetwork=%s: %d objects valid under prometheus-operator %s's CRDs", hostNetwork, n, version)
	}
	sm := byKind(renderChart(t, monitoringOn...), "ServiceMonitor")[0]
	ep := sm.Object["spec"].(map[string]any)["endpoints"].([]any)[0].(map[string]any)
	ep["bearerTokenFiel"] = ep["bearerTokenFile"]
	ep["interval"] = int64(30)
	problems, err := validateObject(crds, sm)
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(problems, "\n")
	for _, want := range []string{`unknown field "bearerTokenFiel"`, "interval: want a string"} {
		if !strings.Contains(got, want) {
			t.Errorf("a broken ServiceMonitor: want a problem with %q, got:\n%s", want, got)
		}
	}
}
