package docs

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/yaml"

	gpuv1alpha1 "github.com/gpuaas/gpu-dra-driver/api/gpu/v1alpha1"
	gpuaas "github.com/gpuaas/gpu-dra-driver/api/gpuaas/v1alpha1"
)

// Kinds of other projects the docs show; TestDocs (test/e2e) applies them
// to a control plane with their CRDs, here they are only parsed.
var otherKinds = map[string]bool{"kueue.x-k8s.io": true}

// TestExamplesAreKnownObjects decodes every ```yaml block of README.md,
// docs/ and the chart's README: complete objects strictly into their Go
// types (an unknown field fails), our opaque configuration and node
// configuration with the driver's own decoders, TenantQuotas through their
// validation; fragments must parse as YAML, Helm values must name the
// chart's keys.
func TestExamplesAreKnownObjects(t *testing.T) {
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	blocks, err := Blocks(root)
	if err != nil {
		t.Fatal(err)
	}
	valueKeys, err := chartValueKeys(root)
	if err != nil {
		t.Fatal(err)
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := gpuaas.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	objects, fragments, values := 0, 0, 0
	for _, b := range blocks {
		t.Run(b.Name(), func(t *testing.T) {
			switch {
			case b.HelmValues:
				values++
				checkValues(t, b, valueKeys)
			case b.Fragment != "":
				fragments++
				var v any
				if err := yaml.Unmarshal([]byte(b.Text), &v); err != nil {
					t.Fatalf("fragment (%s) is not YAML: %v", b.Fragment, err)
				}
			default:
				objs, docs, err := Objects(b)
				if err != nil {
					t.Fatal(err)
				}
				for i, o := range objs {
					objects++
					if err := checkObject(scheme, o, docs[i]); err != nil {
						t.Errorf("%s %s: %v", o.GetKind(), o.GetName(), err)
					}
				}
			}
		})
	}
	if len(blocks) < 15 {
		t.Errorf("found only %d YAML blocks; is the extraction broken?", len(blocks))
	}
	t.Logf("%d YAML blocks: %d objects decoded, %d Helm values blocks, %d fragments", len(blocks), objects, values, fragments)
}

func checkObject(scheme *runtime.Scheme, o *unstructured.Unstructured, doc []byte) error {
	gvk := o.GroupVersionKind()
	switch {
	case gvk.Group == gpuv1alpha1.GroupName && gvk.Kind == "NodeConfig":
		_, err := gpuv1alpha1.DecodeNodeConfig(doc)
		return err
	case otherKinds[gvk.Group]:
		return nil
	}
	typed, err := scheme.New(gvk)
	if err != nil {
		return fmt.Errorf("unknown kind %s (add it to the docs test): %w", gvk, err)
	}
	if err := yaml.UnmarshalStrict(doc, typed); err != nil {
		return err
	}
	if o.GetName() == "" {
		return fmt.Errorf("no metadata.name")
	}
	if q, ok := typed.(*gpuaas.TenantQuota); ok {
		if errs := q.Validate(); len(errs) > 0 {
			return errs.ToAggregate()
		}
	}
	return checkOpaque(o.Object, "")
}

// checkOpaque decodes, with the driver's strict decoder, every opaque
// configuration of ours in the object: ResourceClaim, template and
// DeviceClass configs, and a GpuProfile's spec.config.
func checkOpaque(v any, path string) error {
	switch x := v.(type) {
	case map[string]any:
		if path == ".spec.config" && x["apiVersion"] != nil {
			return decodeOpaque(x, path)
		}
		if x["driver"] == gpuv1alpha1.DriverName && x["parameters"] != nil {
			return decodeOpaque(x["parameters"], path+".parameters")
		}
		for k, c := range x {
			if err := checkOpaque(c, path+"."+k); err != nil {
				return err
			}
		}
	case []any:
		for i, c := range x {
			if err := checkOpaque(c, fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
	}
	return nil
}

func decodeOpaque(v any, path string) error {
	raw, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if _, err := gpuv1alpha1.Decode(raw); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// checkValues: Helm values are a map of the chart's keys, and their node
// configuration passes the plugin's decoder.
func checkValues(t *testing.T, b Block, valueKeys map[string]bool) {
	m, err := b.Values()
	if err != nil {
		t.Fatal(err)
	}
	for k := range m {
		if !valueKeys[k] {
			t.Errorf("%q is not a value of the chart", k)
		}
	}
	plugin, _ := m["kubeletPlugin"].(map[string]any)
	if nc, ok := plugin["nodeConfig"].(map[string]any); ok {
		nc["apiVersion"], nc["kind"] = gpuv1alpha1.SchemeGroupVersion.String(), "NodeConfig"
		data, err := yaml.Marshal(nc)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := gpuv1alpha1.DecodeNodeConfig(data); err != nil {
			t.Errorf("kubeletPlugin.nodeConfig: %v", err)
		}
	}
}

var mdLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// TestLinksResolve: every relative link of the tested Markdown names a file
// or directory that exists, and a #fragment into a Markdown file one of its
// headings (GitHub's anchors).
func TestLinksResolve(t *testing.T) {
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	files, err := Files(root)
	if err != nil {
		t.Fatal(err)
	}
	links := 0
	for _, f := range files {
		data, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		inFence := false
		for i, line := range strings.Split(string(data), "\n") {
			if strings.HasPrefix(strings.TrimSpace(line), "```") {
				inFence = !inFence
			}
			if inFence {
				continue
			}
			for _, m := range mdLink.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				links++
				path, anchor, _ := strings.Cut(target, "#")
				file := filepath.Join(root, filepath.Dir(f), path)
				if path == "" {
					file = filepath.Join(root, f)
				}
				if _, err := os.Stat(file); err != nil {
					t.Errorf("%s:%d: link %s: %v", f, i+1, target, err)
					continue
				}
				if anchor != "" && strings.HasSuffix(file, ".md") && !anchors(t, file)[anchor] {
					t.Errorf("%s:%d: link %s: no heading with anchor #%s", f, i+1, target, anchor)
				}
			}
		}
	}
	t.Logf("%d relative links resolve", links)
}

// anchors are GitHub's heading anchors of a Markdown file.
func anchors(t *testing.T, file string) map[string]bool {
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	inFence := false
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			inFence = !inFence
		}
		if inFence || !strings.HasPrefix(line, "#") {
			continue
		}
		h := strings.ToLower(strings.TrimSpace(strings.TrimLeft(line, "#")))
		var b strings.Builder
		for _, r := range h {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				b.WriteRune(r)
			}
		}
		a := b.String()
		for n := 1; out[a]; n++ {
			a = fmt.Sprintf("%s-%d", b.String(), n)
		}
		out[a] = true
	}
	return out
}
