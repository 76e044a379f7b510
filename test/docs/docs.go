// Package docs finds the YAML examples of the project's Markdown (README.md,
// docs/ and the chart's README) so that tests can check every one: this
// package's test decodes them into Kubernetes objects of known kinds, and
// the e2e test TestDocs applies them to a real API server (server-side
// dry run).
//
// A ```yaml block is one or more complete objects (apiVersion and kind),
// unless it is deliberately partial. A partial block says so on its first
// line, visibly to the reader:
//
//	# fragment: <what it is part of>
//
// It must still parse as YAML. A block of Helm values for the chart (a
// fragment "Helm values ...", or a block whose top-level keys are all
// keys of the chart's values.yaml) is rendered with the chart in TestDocs.
package docs

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// FragmentMarker opens a block that is deliberately partial.
const FragmentMarker = "# fragment:"

// Block is one ```yaml block of a Markdown file.
type Block struct {
	File string // relative to the repository root
	Line int    // of the opening fence
	Text string // the block, its common indentation removed
	// Fragment is what a partial block says it is part of; empty for a
	// block of complete objects.
	Fragment string
	// HelmValues: the block is values for the chart.
	HelmValues bool
}

// Name identifies the block in test names and messages.
func (b Block) Name() string { return fmt.Sprintf("%s:%d", b.File, b.Line) }

// Files are the Markdown files whose examples are tested.
func Files(root string) ([]string, error) {
	files := []string{"README.md", "deployments/helm/gpuaas-dra/README.md"}
	err := filepath.WalkDir(filepath.Join(root, "docs"), func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(path, ".md") {
			rel, err := filepath.Rel(root, path)
			if err != nil {
				return err
			}
			files = append(files, rel)
		}
		return nil
	})
	sort.Strings(files)
	return files, err
}

// Blocks returns every ```yaml block of the files.
func Blocks(root string) ([]Block, error) {
	files, err := Files(root)
	if err != nil {
		return nil, err
	}
	valueKeys, err := chartValueKeys(root)
	if err != nil {
		return nil, err
	}
	var blocks []Block
	for _, f := range files {
		data, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			return nil, err
		}
		bs, err := extract(f, data)
		if err != nil {
			return nil, err
		}
		for i := range bs {
			classify(&bs[i], valueKeys)
		}
		blocks = append(blocks, bs...)
	}
	return blocks, nil
}

// extract finds the fenced ```yaml blocks of one Markdown file; fences may
// be indented (inside a list item).
func extract(file string, data []byte) ([]Block, error) {
	var blocks []Block
	sc := bufio.NewScanner(bytes.NewReader(data))
	var cur *Block
	var indent string
	var lines []string
	n := 0
	for sc.Scan() {
		n++
		line := sc.Text()
		trimmed := strings.TrimLeft(line, " ")
		if cur == nil {
			if strings.HasPrefix(trimmed, "```yaml") || strings.HasPrefix(trimmed, "```yml") {
				cur = &Block{File: file, Line: n}
				indent = line[:len(line)-len(trimmed)]
				lines = nil
			}
			continue
		}
		if strings.HasPrefix(trimmed, "```") {
			cur.Text = strings.Join(lines, "\n") + "\n"
			blocks = append(blocks, *cur)
			cur = nil
			continue
		}
		lines = append(lines, strings.TrimPrefix(line, indent))
	}
	if cur != nil {
		return nil, fmt.Errorf("%s:%d: ```yaml block is not closed", file, cur.Line)
	}
	return blocks, sc.Err()
}

func classify(b *Block, valueKeys map[string]bool) {
	first, _, _ := strings.Cut(strings.TrimLeft(b.Text, "\n"), "\n")
	if rest, ok := strings.CutPrefix(strings.TrimSpace(first), FragmentMarker); ok {
		b.Fragment = strings.TrimSpace(rest)
		b.HelmValues = strings.HasPrefix(b.Fragment, "Helm values")
		return
	}
	var m map[string]any
	if err := yaml.Unmarshal([]byte(b.Text), &m); err != nil || len(m) == 0 {
		return
	}
	if _, ok := m["apiVersion"]; ok {
		return
	}
	for k := range m {
		if !valueKeys[k] {
			return
		}
	}
	b.HelmValues = true
}

// chartValueKeys are the top-level keys of the chart's values.yaml.
func chartValueKeys(root string) (map[string]bool, error) {
	data, err := os.ReadFile(filepath.Join(root, "deployments/helm/gpuaas-dra/values.yaml"))
	if err != nil {
		return nil, err
	}
	var m map[string]any
	if err := yaml.Unmarshal(data, &m); err != nil {
		return nil, err
	}
	keys := map[string]bool{}
	for k := range m {
		keys[k] = true
	}
	return keys, nil
}

// Objects splits a block of complete objects into its documents; each must
// have apiVersion, kind and metadata.name (or be a kind without metadata,
// such as NodeConfig).
func Objects(b Block) ([]*unstructured.Unstructured, [][]byte, error) {
	var objs []*unstructured.Unstructured
	var docs [][]byte
	r := utilyaml.NewYAMLReader(bufio.NewReader(strings.NewReader(b.Text)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", b.Name(), err)
		}
		if len(bytes.TrimSpace(stripComments(doc))) == 0 {
			continue
		}
		var m map[string]any
		if err := yaml.Unmarshal(doc, &m); err != nil {
			return nil, nil, fmt.Errorf("%s: not YAML: %w", b.Name(), err)
		}
		u := &unstructured.Unstructured{Object: m}
		if u.GetAPIVersion() == "" || u.GetKind() == "" {
			return nil, nil, fmt.Errorf("%s: a document without apiVersion and kind (mark a partial block with %q)", b.Name(), FragmentMarker)
		}
		objs = append(objs, u)
		docs = append(docs, doc)
	}
	if len(objs) == 0 {
		return nil, nil, fmt.Errorf("%s: no object in the block", b.Name())
	}
	return objs, docs, nil
}

func stripComments(doc []byte) []byte {
	var out bytes.Buffer
	for _, l := range strings.Split(string(doc), "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "#") {
			continue
		}
		out.WriteString(l + "\n")
	}
	return out.Bytes()
}

// RepoRoot walks up from the working directory to go.mod.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("go.mod not found above the working directory")
		}
		dir = parent
	}
}

// Values returns a Helm values block as whole values for the chart: a
// fragment "Helm values under a.b" is put under that key.
func (b Block) Values() (map[string]any, error) {
	var m map[string]any
	if err := yaml.Unmarshal([]byte(b.Text), &m); err != nil {
		return nil, fmt.Errorf("%s: Helm values are not a YAML map: %w", b.Name(), err)
	}
	under, ok := strings.CutPrefix(b.Fragment, "Helm values under ")
	if !ok {
		return m, nil
	}
	keys := strings.Split(strings.Fields(under)[0], ".")
	for i := len(keys) - 1; i >= 0; i-- {
		m = map[string]any{keys[i]: m}
	}
	return m, nil
}
