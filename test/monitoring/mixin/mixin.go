// Package mixin reads the chart's monitoring mixin
// (deployments/helm/gpuaas-dra/monitoring): its Prometheus rule files and
// its Grafana dashboards, as the tests of test/monitoring (against the
// metrics the binaries register) and test/e2e (against a real Prometheus)
// read them.
package mixin

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"sigs.k8s.io/yaml"
)

const (
	// Dir is the mixin's directory, relative to the repository root.
	Dir = "deployments/helm/gpuaas-dra/monitoring"
	// RuleFile is the chart's rule file, relative to Dir.
	RuleFile = "rules/gpuaas-dra.rules.yaml"
)

// Rules is a Prometheus rule file.
type Rules struct {
	Groups []RuleGroup `json:"groups"`
}

// RuleGroup is one group of a rule file.
type RuleGroup struct {
	Name  string `json:"name"`
	Rules []Rule `json:"rules"`
}

// Rule is a recording rule (Record set) or an alerting rule (Alert set).
type Rule struct {
	Record      string            `json:"record"`
	Alert       string            `json:"alert"`
	Expr        string            `json:"expr"`
	For         string            `json:"for"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
}

// All is every rule of the file, in file order.
func (r Rules) All() []Rule {
	var all []Rule
	for _, g := range r.Groups {
		all = append(all, g.Rules...)
	}
	return all
}

// LoadRules reads a rule file. Fields a rule file may not have fail it.
func LoadRules(path string) (Rules, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Rules{}, err
	}
	var r Rules
	if err := yaml.UnmarshalStrict(data, &r); err != nil {
		return Rules{}, fmt.Errorf("%s: %w", path, err)
	}
	return r, nil
}

// Dashboard is the part of a Grafana dashboard the tests read.
type Dashboard struct {
	// File is the dashboard's file name, without its directory.
	File       string  `json:"-"`
	UID        string  `json:"uid"`
	Title      string  `json:"title"`
	Panels     []Panel `json:"panels"`
	Templating struct {
		List []Variable `json:"list"`
	} `json:"templating"`
}

// Panel is a dashboard panel, or a row with its panels.
type Panel struct {
	ID         int            `json:"id"`
	Title      string         `json:"title"`
	Type       string         `json:"type"`
	Datasource map[string]any `json:"datasource"`
	Targets    []struct {
		Expr  string `json:"expr"`
		RefID string `json:"refId"`
	} `json:"targets"`
	Panels []Panel `json:"panels"` // a row's
}

// Variable is a dashboard's template variable.
type Variable struct {
	Name  string          `json:"name"`
	Type  string          `json:"type"`
	Query json.RawMessage `json:"query"`
}

// VariableQuery is a query variable's name and expression.
type VariableQuery struct {
	Name, Expr string
}

// VariableQueries is the dashboard's query variables (those Grafana fills
// from Prometheus), in order.
func (d Dashboard) VariableQueries() ([]VariableQuery, error) {
	var out []VariableQuery
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		expr, err := v.queryExpr()
		if err != nil {
			return nil, fmt.Errorf("variable %s: %w", v.Name, err)
		}
		out = append(out, VariableQuery{Name: v.Name, Expr: expr})
	}
	return out, nil
}

// queryExpr is a query variable's expression: Grafana writes it as a
// string or as an object with a query field.
func (v Variable) queryExpr() (string, error) {
	var s string
	if json.Unmarshal(v.Query, &s) == nil {
		return s, nil
	}
	var q struct {
		Query string `json:"query"`
	}
	if err := json.Unmarshal(v.Query, &q); err != nil {
		return "", fmt.Errorf("query is neither an object nor a string: %w", err)
	}
	return q.Query, nil
}

// AllPanels is every panel of the dashboard, each row followed by its
// nested panels.
func (d Dashboard) AllPanels() []Panel {
	return flatPanels(d.Panels)
}

func flatPanels(ps []Panel) []Panel {
	var out []Panel
	for _, p := range ps {
		out = append(out, p)
		out = append(out, flatPanels(p.Panels)...)
	}
	return out
}

// LoadDashboards reads every dashboard (*.json) of dir, in file name
// order; a dir without any fails.
func LoadDashboards(dir string) ([]Dashboard, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return nil, fmt.Errorf("no dashboards under %s: %w", dir, err)
	}
	if len(paths) == 0 {
		return nil, fmt.Errorf("no dashboards under %s", dir)
	}
	var out []Dashboard
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		var d Dashboard
		if err := json.Unmarshal(data, &d); err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		d.File = filepath.Base(p)
		out = append(out, d)
	}
	return out, nil
}
