// Package chartpolicy evaluates the CEL of the chart's
// ValidatingAdmissionPolicies with the API server's CEL environment, on
// objects the tests build, without a cluster: the e2e tests apply the same
// policies to a real API server.
package chartpolicy

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/google/cel-go/cel"
	"k8s.io/apiserver/pkg/cel/environment"
	"sigs.k8s.io/yaml"
)

// policyFile holds the controller's policies.
const policyFile = "deployments/helm/gpuaas-dra/templates/controller-policy.yaml"

// validation compiles the first validation of the chart's policy named
// <fullname>-suffix, with object and oldObject as the API server declares
// them (template actions in the expression's text are blanked).
func validation(t *testing.T, suffix string) cel.Program {
	t.Helper()
	// go test runs in the package's directory (runtime.Caller's path is
	// module-relative under -trimpath, as make builds).
	raw, err := os.ReadFile(filepath.Join("..", "..", policyFile))
	if err != nil {
		t.Fatal(err)
	}
	s := string(raw)
	i := strings.Index(s, "name: {{ $name }}"+suffix+"\n")
	if i < 0 {
		t.Fatalf("no policy *%s in %s", suffix, policyFile)
	}
	doc := s[i:]
	doc = doc[strings.Index(doc, "  validations:"):]
	doc = doc[:strings.Index(doc, "    messageExpression")]
	doc = regexp.MustCompile(`\{\{[^}]*\}\}`).ReplaceAllString(doc, "x")
	var pol struct {
		Validations []struct{ Expression string } `json:"validations"`
	}
	if err := yaml.Unmarshal([]byte(strings.TrimPrefix(doc, "  ")), &pol); err != nil || len(pol.Validations) == 0 {
		t.Fatalf("reading the validations of *%s: %v\n%s", suffix, err, doc)
	}
	env, err := environment.MustBaseEnvSet(environment.DefaultCompatibilityVersion()).Env(environment.StoredExpressions)
	if err != nil {
		t.Fatal(err)
	}
	env, err = env.Extend(cel.Variable("object", cel.DynType), cel.Variable("oldObject", cel.DynType))
	if err != nil {
		t.Fatal(err)
	}
	ast, iss := env.Compile(pol.Validations[0].Expression)
	if iss.Err() != nil {
		t.Fatalf("compiling *%s: %v", suffix, iss.Err())
	}
	prg, err := env.Program(ast)
	if err != nil {
		t.Fatal(err)
	}
	return prg
}

func workload(active bool) map[string]any {
	return map[string]any{
		"metadata": map[string]any{"name": "job-notebook-1a2b3", "labels": map[string]any{"kueue.x-k8s.io/job-uid": "u"},
			"ownerReferences": []any{map[string]any{"kind": "Job", "name": "notebook", "uid": "u"}}},
		"spec": map[string]any{"active": active, "queueName": "queue", "priority": int64(0),
			"podSets": []any{map[string]any{"name": "main", "count": int64(1)}}},
	}
}

// The idle policy's Deactivate may set spec.active=false and nothing else:
// the controller's ServiceAccount can neither move a tenant's Workload
// (queue, priority, pod sets, owners, labels) nor reactivate one.
func TestControllerMayOnlyDeactivateWorkloads(t *testing.T) {
	prg := validation(t, "-workload-deactivate")
	for _, c := range []struct {
		name   string
		change func(spec, meta map[string]any)
		allow  bool
	}{
		{"deactivate", func(spec, _ map[string]any) { spec["active"] = false }, true},
		{"reactivate", func(spec, _ map[string]any) {}, false},
		{"another queue", func(spec, _ map[string]any) { spec["active"], spec["queueName"] = false, "other" }, false},
		{"a priority", func(spec, _ map[string]any) { spec["active"], spec["priority"] = false, int64(1000) }, false},
		{"a run time", func(spec, _ map[string]any) { spec["active"], spec["maximumExecutionTimeSeconds"] = false, int64(5) }, false},
		{"pod sets", func(spec, _ map[string]any) { spec["active"], spec["podSets"] = false, []any{} }, false},
		{"a label", func(spec, meta map[string]any) { spec["active"], meta["labels"] = false, map[string]any{"x": "y"} }, false},
		{"an annotation", func(spec, meta map[string]any) { spec["active"], meta["annotations"] = false, map[string]any{"x": "y"} }, false},
		{"owners", func(spec, meta map[string]any) { spec["active"] = false; delete(meta, "ownerReferences") }, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			obj := workload(true)
			c.change(obj["spec"].(map[string]any), obj["metadata"].(map[string]any))
			out, _, err := prg.Eval(map[string]any{"object": obj, "oldObject": workload(true)})
			if err != nil {
				t.Fatal(err)
			}
			if got := out.Value() == true; got != c.allow {
				t.Errorf("allowed = %v, want %v", got, c.allow)
			}
		})
	}
	// An inactive Workload written unchanged (a retry) is allowed.
	out, _, err := prg.Eval(map[string]any{"object": workload(false), "oldObject": workload(false)})
	if err != nil || out.Value() != true {
		t.Errorf("rewriting an inactive Workload unchanged: %v (%v), want allowed", out, err)
	}
}
