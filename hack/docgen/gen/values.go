package gen

import (
	"bufio"
	"bytes"
	_ "embed"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"text/template"

	"sigs.k8s.io/yaml"
)

//go:embed chart-readme.md.tmpl
var chartReadmeTemplate string

// valueDoc is one documented key of values.yaml.
type valueDoc struct {
	Path        string   // dotted, e.g. kubeletPlugin.driverRoot
	Type        string   // string, integer, boolean, list, map
	Default     string   // compact JSON, or "" for a section
	Description string   // the comment's prose
	Example     []string // the comment's indented lines (an example), if any
	section     bool     // a map documented key by key below it
}

var keyLine = regexp.MustCompile(`^( *)([A-Za-z0-9_.-]+):(?:\s|$)`)

// parseValues reads values.yaml's keys (block mappings, two-space indents)
// with the comment lines right above each one, and the values themselves
// through a YAML decoder.
func parseValues(data []byte) ([]valueDoc, error) {
	var values map[string]any
	if err := yaml.Unmarshal(data, &values); err != nil {
		return nil, fmt.Errorf("values.yaml: %w", err)
	}
	type key struct {
		path    string
		indent  int
		comment []string
	}
	var keys []key
	var stack []key // open mappings by indent
	var comment []string
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		switch {
		case trimmed == "":
			comment = nil
			continue
		case strings.HasPrefix(trimmed, "#"):
			comment = append(comment, strings.TrimPrefix(strings.TrimPrefix(trimmed, "#"), " "))
			continue
		}
		m := keyLine.FindStringSubmatch(line)
		if m == nil || strings.HasPrefix(trimmed, "-") {
			comment = nil
			continue // list items and continuation lines belong to a value
		}
		indent := len(m[1])
		for len(stack) > 0 && stack[len(stack)-1].indent >= indent {
			stack = stack[:len(stack)-1]
		}
		path := m[2]
		if len(stack) > 0 {
			parent := stack[len(stack)-1].path
			if _, ok := lookup(values, parent).(map[string]any); !ok {
				comment = nil
				continue // a key inside a list item's map
			}
			path = parent + "." + path
		}
		k := key{path: path, indent: indent, comment: comment}
		keys = append(keys, k)
		stack = append(stack, k)
		comment = nil
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	commented := map[string]bool{}
	for _, k := range keys {
		if len(k.comment) > 0 {
			commented[k.path] = true
		}
	}
	// A map whose keys (at any depth) carry comments is documented key by
	// key; any other value is one row.
	hasCommentedDescendant := func(p string) bool {
		for c := range commented {
			if strings.HasPrefix(c, p+".") {
				return true
			}
		}
		return false
	}
	var docs []valueDoc
	skipUnder := ""
	for _, k := range keys {
		if skipUnder != "" && strings.HasPrefix(k.path, skipUnder+".") {
			continue
		}
		skipUnder = ""
		v := lookup(values, k.path)
		d := valueDoc{Path: k.path, Type: typeOf(v)}
		d.Description, d.Example = splitComment(k.comment)
		if m, ok := v.(map[string]any); ok && len(m) > 0 && hasCommentedDescendant(k.path) {
			d.section = true
			if d.Description == "" && len(d.Example) == 0 {
				continue
			}
		} else {
			d.Default = compact(v)
			skipUnder = k.path
		}
		docs = append(docs, d)
	}
	return docs, nil
}

// splitComment separates a comment's prose from an example: lines indented
// past the comment marker ("#   default: {}").
func splitComment(lines []string) (string, []string) {
	var prose, example []string
	for _, l := range lines {
		if strings.HasPrefix(l, "  ") {
			example = append(example, strings.TrimPrefix(l, "  "))
			continue
		}
		prose = append(prose, l)
	}
	return strings.Join(prose, " "), example
}

func lookup(values map[string]any, path string) any {
	var cur any = values
	for _, p := range strings.Split(path, ".") {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil
		}
		cur = m[p]
	}
	return cur
}

func typeOf(v any) string {
	switch v.(type) {
	case string:
		return "string"
	case bool:
		return "boolean"
	case float64, int64, int:
		return "number"
	case []any:
		return "list"
	case map[string]any:
		return "map"
	case nil:
		return "null"
	}
	return fmt.Sprintf("%T", v)
}

const seeValues = "(see values.yaml)"

// compact is v as one line of JSON; a long one is left to values.yaml.
func compact(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	if len(b) > 90 {
		return seeValues
	}
	return string(b)
}

// ChartReadme renders the chart's README.md from its Chart.yaml,
// values.yaml and the template in this package.
func ChartReadme(chartDir string) ([]byte, error) {
	chartData, err := os.ReadFile(filepath.Join(chartDir, "Chart.yaml"))
	if err != nil {
		return nil, err
	}
	var chart struct {
		Name        string `json:"name"`
		Description string `json:"description"`
		Version     string `json:"version"`
		AppVersion  string `json:"appVersion"`
		KubeVersion string `json:"kubeVersion"`
	}
	if err := yaml.Unmarshal(chartData, &chart); err != nil {
		return nil, fmt.Errorf("reading the chart's Chart.yaml: %w", err)
	}
	valuesData, err := os.ReadFile(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		return nil, err
	}
	docs, err := parseValues(valuesData)
	if err != nil {
		return nil, err
	}
	var table, examples strings.Builder
	table.WriteString("| Key | Type | Default | Description |\n|---|---|---|---|\n")
	for _, d := range docs {
		desc := d.Description
		if len(d.Example) > 0 {
			anchor := strings.NewReplacer(".", "").Replace(strings.ToLower(d.Path))
			desc += fmt.Sprintf(" Example: [below](#example-%s).", anchor)
			fmt.Fprintf(&examples, "### Example: %s\n\n```yaml\n# fragment: Helm values under %s\n%s\n```\n\n",
				d.Path, d.Path, strings.Join(d.Example, "\n"))
		}
		typ := d.Type
		if d.section {
			typ = "map"
			desc += " (keys below)"
		}
		def := code(d.Default)
		if d.Default == seeValues {
			def = seeValues
		}
		fmt.Fprintf(&table, "| `%s` | %s | %s | %s |\n", d.Path, typ, def, cell(desc))
	}
	tmpl, err := template.New("chart").Parse(chartReadmeTemplate)
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	out.WriteString(Banner)
	err = tmpl.Execute(&out, map[string]any{
		"Chart": chart, "Values": table.String(), "Examples": strings.TrimSpace(examples.String()),
	})
	if err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}
