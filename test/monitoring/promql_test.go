package monitoring

import (
	"fmt"
	"regexp"
	"strings"
	"unicode"
)

// A PromQL reader just deep enough to list what an expression selects:
// metric names, the label names of their matchers, and the labels of
// grouping clauses. Prometheus's own parser is a large module this
// repository does not otherwise need; promtool (TestPromtool) parses the
// rules for real, this only has to find names.

// selector is one vector selector: a metric and the labels it matches on.
type selector struct {
	metric string
	labels map[string]string // label -> matched value (as written)
}

// exprNames is what an expression refers to.
type exprNames struct {
	selectors []selector
	// grouping are labels of by/without/on/ignoring/group_left/group_right.
	grouping []string
	// labelValuesLabel is the label of a Grafana label_values(expr, label).
	labelValuesLabel string
}

var keywords = map[string]bool{
	"and": true, "or": true, "unless": true, "by": true, "without": true, "on": true, "ignoring": true,
	"group_left": true, "group_right": true, "offset": true, "bool": true, "atan2": true, "inf": true, "nan": true,
	"start": true, "end": true,
	// aggregation operators, which may be followed by a grouping clause
	// rather than by their parenthesis
	"sum": true, "min": true, "max": true, "avg": true, "group": true, "stddev": true, "stdvar": true,
	"count": true, "count_values": true, "bottomk": true, "topk": true, "quantile": true,
	"limitk": true, "limit_ratio": true,
}

var groupingKeywords = map[string]bool{
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
}

// grafanaVars replaces Grafana's interval variables, which stand where
// PromQL has durations, with a duration.
var grafanaVars = regexp.MustCompile(`\$__(rate_interval|interval|range)\b`)

// labelValuesRE matches a Grafana variable query label_values(expr, label).
var labelValuesRE = regexp.MustCompile(`^\s*label_values\((.*),\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)\s*$`)

type tok struct {
	kind string // ident, string, number, punct
	text string
}

func tokenize(expr string) ([]tok, error) {
	var toks []tok
	rs := []rune(expr)
	for i := 0; i < len(rs); {
		r := rs[i]
		switch {
		case unicode.IsSpace(r):
			i++
		case r == '#': // comment to end of line
			for i < len(rs) && rs[i] != '\n' {
				i++
			}
		case r == '"' || r == '\'' || r == '`':
			j := i + 1
			for j < len(rs) && rs[j] != r {
				if rs[j] == '\\' && r != '`' {
					j++
				}
				j++
			}
			if j >= len(rs) {
				return nil, fmt.Errorf("unterminated string in %q", expr)
			}
			toks = append(toks, tok{"string", string(rs[i+1 : j])})
			i = j + 1
		case unicode.IsLetter(r) || r == '_' || r == ':':
			j := i
			for j < len(rs) && (unicode.IsLetter(rs[j]) || unicode.IsDigit(rs[j]) || rs[j] == '_' || rs[j] == ':') {
				j++
			}
			toks = append(toks, tok{"ident", string(rs[i:j])})
			i = j
		case unicode.IsDigit(r) || r == '.':
			// numbers and durations (5m, 1h30m, 1e3, 0x1f)
			j := i
			for j < len(rs) && (unicode.IsLetter(rs[j]) || unicode.IsDigit(rs[j]) || rs[j] == '.' ||
				((rs[j] == '+' || rs[j] == '-') && j > i && (rs[j-1] == 'e' || rs[j-1] == 'E'))) {
				j++
			}
			toks = append(toks, tok{"number", string(rs[i:j])})
			i = j
		default:
			// operators: two-character ones first
			if i+1 < len(rs) {
				two := string(rs[i : i+2])
				switch two {
				case "=~", "!~", "!=", "==", ">=", "<=":
					toks = append(toks, tok{"punct", two})
					i += 2
					continue
				}
			}
			toks = append(toks, tok{"punct", string(r)})
			i++
		}
	}
	return toks, nil
}

// parseNames lists the names an expression (a PromQL expression, or a
// Grafana label_values() variable query) refers to.
func parseNames(expr string) (exprNames, error) {
	var out exprNames
	if m := labelValuesRE.FindStringSubmatch(expr); m != nil {
		expr, out.labelValuesLabel = m[1], m[2]
	}
	expr = grafanaVars.ReplaceAllString(expr, "5m")
	toks, err := tokenize(expr)
	if err != nil {
		return out, err
	}
	for i := 0; i < len(toks); i++ {
		t := toks[i]
		next := func(k int) tok {
			if i+k < len(toks) {
				return toks[i+k]
			}
			return tok{}
		}
		switch {
		case t.kind == "punct" && t.text == "[":
			// a range or subquery: skip to its end
			for i < len(toks) && (toks[i].kind != "punct" || toks[i].text != "]") {
				i++
			}
		case t.kind == "punct" && t.text == "{":
			// matchers without a metric name ({__name__=...}) are not used
			return out, fmt.Errorf("a selector without a metric name in %q", expr)
		case t.kind == "ident" && groupingKeywords[t.text] && next(1).text == "(":
			i += 2
			for ; i < len(toks) && toks[i].text != ")"; i++ {
				if toks[i].kind == "ident" {
					out.grouping = append(out.grouping, toks[i].text)
				}
			}
		case t.kind == "ident" && keywords[t.text]:
		case t.kind == "ident" && next(1).text == "(":
			// a function or aggregation
		case t.kind == "ident":
			sel := selector{metric: t.text, labels: map[string]string{}}
			if next(1).text == "{" {
				i += 2
				for ; i < len(toks) && toks[i].text != "}"; i++ {
					if toks[i].kind == "ident" && i+2 < len(toks) && toks[i+2].kind == "string" {
						sel.labels[toks[i].text] = toks[i+2].text
						i += 2
					}
				}
			}
			out.selectors = append(out.selectors, sel)
		}
	}
	return out, nil
}

// promSynthetic are the series Prometheus itself writes for every target
// and alert; they are not in any binary's registry.
var promSynthetic = map[string]bool{
	"up": true, "scrape_duration_seconds": true, "scrape_samples_scraped": true,
	"scrape_samples_post_metric_relabeling": true, "scrape_series_added": true,
	"ALERTS": true, "ALERTS_FOR_STATE": true,
}

// targetLabels are the labels a scrape adds to every series of a target:
// Prometheus's own (job, instance) and those the chart's ServiceMonitor and
// PodMonitor set (the plugin's node; namespace, pod, container, service,
// endpoint from the Prometheus Operator).
var targetLabels = map[string]bool{
	"job": true, "instance": true, "node": true, "namespace": true, "pod": true,
	"container": true, "service": true, "endpoint": true,
}

// suffixes of the series of histograms and summaries.
func baseMetric(inv inventory, name string) (*metric, string) {
	if m := inv[name]; m != nil {
		return m, ""
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		base := strings.TrimSuffix(name, suffix)
		if base == name {
			continue
		}
		if m := inv[base]; m != nil && (m.kind == "histogram" || (m.kind == "summary" && suffix != "_bucket")) {
			return m, suffix
		}
	}
	return nil, ""
}
