package framework

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"sigs.k8s.io/yaml"
)

// PrometheusBinary is the Prometheus server the e2e suite scrapes the
// chart with: Debian bookworm's 2.42.0+ds-5+deb12u1, put into the bin dir
// by hack/build-prometheus.sh (make prometheus), pinned like every other
// binary of the suite so that a query that works here works for users of
// that version and later.
const PrometheusBinary = "prometheus"

// PrometheusUnavailable says why the suite cannot run Prometheus from
// binDir, or "" when it can. Under E2E_REQUIRED=1 the suite's setup fails
// on it rather than letting the Prometheus test skip.
func PrometheusUnavailable(binDir string) string {
	path := filepath.Join(binDir, PrometheusBinary)
	if info, err := os.Stat(path); err != nil || info.IsDir() || info.Mode()&0o111 == 0 {
		return fmt.Sprintf("%s not found or not executable; run make prometheus", path)
	}
	return ""
}

// ScrapeTarget is one static scrape job of a Prometheus configuration.
type ScrapeTarget struct {
	// Job is the job label the series get (what rules and dashboards select on).
	Job string
	// Targets are host:port addresses.
	Targets []string
	// Labels are added to every series of the job (the `node` label a
	// PodMonitor would take from the pod's node, say).
	Labels map[string]string
	// HTTPS scrapes with TLS, trusting the target's certificate as a
	// ServiceMonitor's insecureSkipVerify does.
	HTTPS bool
	// BearerTokenFile is sent as the scraper's credentials when not empty.
	BearerTokenFile string
	// Interval overrides the scrape interval (and timeout) of this job: a
	// large /metrics, the API server's, takes longer than a second to
	// scrape on a loaded machine.
	Interval time.Duration
	// Keep, when not empty, is a regular expression of the metric names
	// kept from the job (metric_relabel_configs); the rest is dropped at
	// scrape time.
	Keep string
}

// PrometheusOptions describe a Prometheus server.
type PrometheusOptions struct {
	Targets []ScrapeTarget
	// RuleFiles are loaded as they are (the chart's own rule file).
	RuleFiles []string
	// Interval is both the scrape and the rule evaluation interval; short,
	// so that rates and recording rules have data seconds after an event.
	Interval time.Duration
}

// Prometheus is a Prometheus server run as a child process, with its
// configuration and TSDB under Dir.
type Prometheus struct {
	URL     string
	Dir     string
	Process *Process
}

// StartPrometheus writes a configuration of static targets, starts
// Prometheus on a free local port and waits until it is ready.
func (cp *ControlPlane) StartPrometheus(ctx context.Context, dir string, opts PrometheusOptions) (*Prometheus, error) {
	if why := PrometheusUnavailable(cp.BinDir); why != "" {
		return nil, errors.New(why)
	}
	if opts.Interval == 0 {
		opts.Interval = time.Second
	}
	cfgPath := filepath.Join(dir, "prometheus.yml")
	cfg, err := prometheusConfig(opts)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(cfgPath, cfg, 0o600); err != nil {
		return nil, fmt.Errorf("writing the Prometheus configuration: %w", err)
	}
	addr, err := FreeAddr()
	if err != nil {
		return nil, err
	}
	p := &Prometheus{URL: "http://" + addr, Dir: dir}
	p.Process = NewProcess("prometheus", filepath.Join(cp.BinDir, PrometheusBinary), filepath.Join(cp.LogDir, "prometheus.log"),
		"--config.file="+cfgPath,
		"--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr,
		// Debian's build looks for its console templates under /etc; none
		// are needed.
		"--web.console.templates="+dir, "--web.console.libraries="+dir,
		"--log.level=info")
	if err := p.Process.Start(); err != nil {
		return nil, err
	}
	if err := waitHealthy(ctx, p.Process, p.URL+"/-/ready", ""); err != nil {
		return nil, errors.Join(err, p.Process.Stop())
	}
	cp.logf("prometheus ready at %s (config %s)", p.URL, cfgPath)
	return p, nil
}

// prometheusConfig renders the configuration file.
func prometheusConfig(opts PrometheusOptions) ([]byte, error) {
	type tls struct {
		InsecureSkipVerify bool `json:"insecure_skip_verify"`
	}
	type static struct {
		Targets []string          `json:"targets"`
		Labels  map[string]string `json:"labels,omitempty"`
	}
	type relabel struct {
		SourceLabels []string `json:"source_labels"`
		Regex        string   `json:"regex"`
		Action       string   `json:"action"`
	}
	type job struct {
		JobName         string    `json:"job_name"`
		ScrapeInterval  string    `json:"scrape_interval,omitempty"`
		ScrapeTimeout   string    `json:"scrape_timeout,omitempty"`
		Scheme          string    `json:"scheme"`
		TLSConfig       *tls      `json:"tls_config,omitempty"`
		BearerTokenFile string    `json:"bearer_token_file,omitempty"`
		StaticConfigs   []static  `json:"static_configs"`
		MetricRelabel   []relabel `json:"metric_relabel_configs,omitempty"`
	}
	interval := opts.Interval.String()
	cfg := struct {
		Global map[string]string `json:"global"`
		Rules  []string          `json:"rule_files,omitempty"`
		Jobs   []job             `json:"scrape_configs"`
	}{
		Global: map[string]string{"scrape_interval": interval, "scrape_timeout": interval, "evaluation_interval": interval},
		Rules:  opts.RuleFiles,
	}
	for _, t := range opts.Targets {
		j := job{JobName: t.Job, Scheme: "http", BearerTokenFile: t.BearerTokenFile,
			StaticConfigs: []static{{Targets: t.Targets, Labels: t.Labels}}}
		if t.HTTPS {
			j.Scheme, j.TLSConfig = "https", &tls{InsecureSkipVerify: true}
		}
		if t.Interval != 0 {
			j.ScrapeInterval, j.ScrapeTimeout = t.Interval.String(), t.Interval.String()
		}
		if t.Keep != "" {
			j.MetricRelabel = []relabel{{SourceLabels: []string{"__name__"}, Regex: t.Keep, Action: "keep"}}
		}
		cfg.Jobs = append(cfg.Jobs, j)
	}
	return yaml.Marshal(cfg)
}

// Stop ends Prometheus.
func (p *Prometheus) Stop() error { return p.Process.Stop() }

// Sample is one series of an instant query's result: its labels and value
// (as Prometheus writes it: a number, NaN or +Inf).
type Sample struct {
	Metric map[string]string
	Value  string
}

// String is the sample as `{labels} value`.
func (s Sample) String() string {
	pairs := make([]string, 0, len(s.Metric))
	for k, v := range s.Metric {
		pairs = append(pairs, k+"="+v)
	}
	sort.Strings(pairs)
	return "{" + strings.Join(pairs, ",") + "} " + s.Value
}

// Query evaluates a PromQL expression at the current time through the
// HTTP API (/api/v1/query), as Grafana's instant queries and the rule
// manager do, and returns the vector's samples (a scalar is one sample
// without labels). A query Prometheus refuses (a syntax error) is an error.
func (p *Prometheus) Query(ctx context.Context, expr string) ([]Sample, error) {
	var data struct {
		ResultType string          `json:"resultType"`
		Result     json.RawMessage `json:"result"`
	}
	if err := p.get(ctx, "/api/v1/query?"+url.Values{"query": {expr}}.Encode(), &data); err != nil {
		return nil, fmt.Errorf("query %q: %w", expr, err)
	}
	switch data.ResultType {
	case "vector":
		var v []struct {
			Metric map[string]string `json:"metric"`
			Value  [2]any            `json:"value"`
		}
		if err := json.Unmarshal(data.Result, &v); err != nil {
			return nil, fmt.Errorf("query %q: decoding the vector: %w", expr, err)
		}
		out := make([]Sample, 0, len(v))
		for _, s := range v {
			out = append(out, Sample{Metric: s.Metric, Value: fmt.Sprint(s.Value[1])})
		}
		return out, nil
	case "scalar":
		var v [2]any
		if err := json.Unmarshal(data.Result, &v); err != nil {
			return nil, fmt.Errorf("query %q: decoding the scalar: %w", expr, err)
		}
		return []Sample{{Value: fmt.Sprint(v[1])}}, nil
	default:
		return nil, fmt.Errorf("query %q: result type %s, want a vector or scalar", expr, data.ResultType)
	}
}

// Alert is one active alert of /api/v1/alerts: pending (its expression
// holds, its `for` has not passed yet) or firing.
type Alert struct {
	Labels map[string]string `json:"labels"`
	State  string            `json:"state"`
	Value  string            `json:"value"`
}

// Alerts lists the active alerts.
func (p *Prometheus) Alerts(ctx context.Context) ([]Alert, error) {
	var data struct {
		Alerts []Alert `json:"alerts"`
	}
	if err := p.get(ctx, "/api/v1/alerts", &data); err != nil {
		return nil, fmt.Errorf("listing alerts: %w", err)
	}
	return data.Alerts, nil
}

// RuleState is one rule as /api/v1/rules reports it: its health and the
// error of its last evaluation.
type RuleState struct {
	Group     string
	Name      string
	Type      string
	Health    string
	LastError string
}

// Rules lists the loaded rules.
func (p *Prometheus) Rules(ctx context.Context) ([]RuleState, error) {
	var data struct {
		Groups []struct {
			Name  string `json:"name"`
			Rules []struct {
				Name      string `json:"name"`
				Type      string `json:"type"`
				Health    string `json:"health"`
				LastError string `json:"lastError"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := p.get(ctx, "/api/v1/rules", &data); err != nil {
		return nil, fmt.Errorf("listing rules: %w", err)
	}
	var out []RuleState
	for _, g := range data.Groups {
		for _, r := range g.Rules {
			out = append(out, RuleState{Group: g.Name, Name: r.Name, Type: r.Type, Health: r.Health, LastError: r.LastError})
		}
	}
	return out, nil
}

// Target is one scrape target's state.
type Target struct {
	Job       string
	URL       string
	Health    string
	LastError string
}

// Targets lists the active scrape targets.
func (p *Prometheus) Targets(ctx context.Context) ([]Target, error) {
	var data struct {
		ActiveTargets []struct {
			Labels    map[string]string `json:"labels"`
			ScrapeURL string            `json:"scrapeUrl"`
			Health    string            `json:"health"`
			LastError string            `json:"lastError"`
		} `json:"activeTargets"`
	}
	if err := p.get(ctx, "/api/v1/targets?state=active", &data); err != nil {
		return nil, fmt.Errorf("listing targets: %w", err)
	}
	out := make([]Target, 0, len(data.ActiveTargets))
	for _, t := range data.ActiveTargets {
		out = append(out, Target{Job: t.Labels["job"], URL: t.ScrapeURL, Health: t.Health, LastError: t.LastError})
	}
	return out, nil
}

// get GETs an API path and decodes the data of a success envelope into out.
func (p *Prometheus) get(ctx context.Context, path string, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.URL+path, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	var env struct {
		Status string          `json:"status"`
		Data   json.RawMessage `json:"data"`
		Error  string          `json:"error"`
	}
	if err := json.Unmarshal(body, &env); err != nil {
		return fmt.Errorf("HTTP %d: %.300s", resp.StatusCode, body)
	}
	if env.Status != "success" {
		return fmt.Errorf("HTTP %d: %s", resp.StatusCode, env.Error)
	}
	return json.Unmarshal(env.Data, out)
}
