package main

import (
	"errors"
	"strings"
	"testing"

	"github.com/gpuaas/gpu-dra-driver/test/e2e/framework"
)

func sample(value string, labels ...string) framework.Sample {
	m := map[string]string{}
	for i := 0; i+1 < len(labels); i += 2 {
		m[labels[i]] = labels[i+1]
	}
	return framework.Sample{Metric: m, Value: value}
}

// TestMonitoringLines: the numbers Prometheus answered, one line each, in a
// stable order, short; what it could not answer says so on its own line.
func TestMonitoringLines(t *testing.T) {
	r := monitoringReadings{
		URL: "http://127.0.0.1:9090",
		Targets: []framework.Target{
			{Job: promPluginJob, Health: "up"},
			{Job: promControllerJob, Health: "up"},
			{Job: promAPIServerJob, Health: "down", LastError: "401 Unauthorized"},
		},
		Results: map[string][]framework.Sample{
			"posture":        {sample("2", "posture", "Unhealthy"), sample("1", "posture", "Available")},
			"used":           {sample("0.14285714285714285", "tenant", "team-a")},
			"reserved":       {sample("0.2857142857142857", "tenant", "team-a"), sample("0", "tenant", "team-b")},
			"limit":          {sample("2", "tenant", "team-b"), sample("0.3", "tenant", "team-a")},
			"denials":        {sample("1", "tenant", "team-a"), sample("0", "tenant", "team-b")},
			"prepareP99":     {sample("0.0123")},
			"prepareP50":     {sample("0.0012")},
			"prepareBuckets": {sample("42", "le", "0.016"), sample("42", "le", "+Inf"), sample("10", "le", "0.001")},
		},
		Errors: map[string]error{},
		Alerts: []framework.Alert{
			{Labels: map[string]string{"alertname": "GpuaasTenantAtLimit", "tenant": "team-a", "resource": "gpuUnits", "severity": "warning"}, State: "pending"},
			{Labels: map[string]string{"alertname": "GpuaasGPUUnhealthy", "node": "n1", "gpu": "5", "severity": "critical"}, State: "pending"},
		},
	}
	want := []string{
		"Prometheus API http://127.0.0.1:9090 (a Grafana data source; stops with the demo; DEMO_FLAGS=--keep keeps it), the chart's rules loaded, reads:",
		"  targets up       2 of 3 (apiserver down: 401 Unauthorized, gpuaas-dra-controller, gpuaas-dra-kubelet-plugin)",
		"  GPUs by posture  Available 1, Unhealthy 2",
		"  GPU units        used+reserved/limit team-a 0.143+0.286/0.3, team-b ?+0/2",
		"  quota denials    team-a 1, team-b 0",
		"  prepare latency  p50 1.2ms, p99 12.3ms over 42 prepares",
		"  alerts           firing: none; pending: GpuaasGPUUnhealthy{gpu=5,node=n1}, GpuaasTenantAtLimit{resource=gpuUnits,tenant=team-a}",
	}
	if got := monitoringLines(r); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	// No data, a failed query, --keep, and alerts that could not be listed.
	r.Keep = true
	r.Results = map[string][]framework.Sample{"prepareP99": {sample("NaN")}, "prepareP50": {sample("NaN")},
		"prepareBuckets": {sample("0", "le", "0.016"), sample("0", "le", "+Inf")}}
	r.Errors = map[string]error{"denials": errors.New("HTTP 400: parse error\nat line 1")}
	r.AlertsErr = errors.New("connection refused")
	got := monitoringLines(r)
	for i, w := range map[int]string{
		0: "Prometheus API http://127.0.0.1:9090 (a Grafana data source; up with the cluster until Ctrl-C), the chart's rules loaded, reads:",
		2: "  GPUs by posture  no data",
		3: "  GPU units        no data",
		4: "  quota denials    query failed: HTTP 400: parse error",
		5: "  prepare latency  p50 n/a, p99 n/a over 0 prepares",
		6: "  alerts           could not be listed: connection refused",
	} {
		if got[i] != w {
			t.Errorf("line %d: got %q, want %q", i, got[i], w)
		}
	}
}

// TestMonitoringReportIsShort: the whole monitoring account (mixin and
// numbers) stays within 15 lines.
func TestMonitoringReportIsShort(t *testing.T) {
	n := 1 + len(mixinLines()) + len(monitoringLines(monitoringReadings{}))
	if n > 15 {
		t.Errorf("the monitoring report is %d lines, want at most 15", n)
	}
}

// TestPrepareLatency: a p99 that histogram_quantile could only place beyond
// the largest finite bucket is a lower bound, with how many went over it.
func TestPrepareLatency(t *testing.T) {
	buckets := []framework.Sample{sample("20", "le", "8.192"), sample("23", "le", "16.384"), sample("24", "le", "+Inf")}
	if got, want := prepareLatency("0.2304", "16.384", buckets), "p50 230.4ms, p99 >= 16.38s over 24 prepares (1 over 16.38s)"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	buckets[1].Value = "24"
	if got, want := prepareLatency("0.2304", "12.5", buckets), "p50 230.4ms, p99 12.50s over 24 prepares"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if got, want := prepareLatency("?", "?", nil), "p50 n/a, p99 n/a over NaN prepares"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestSecondsAndNumbers(t *testing.T) {
	for in, want := range map[string]string{"0.0005": "0.5ms", "1.5": "1.50s", "+Inf": "above the largest bucket", "NaN": "n/a"} {
		if got := seconds(in); got != want {
			t.Errorf("seconds(%q) = %q, want %q", in, got, want)
		}
	}
	for in, want := range map[string]string{"7": "7", "0.42857": "0.429", "1234": "1234", "NaN": "NaN", "": "?", "x": "x"} {
		if got := number(in); got != want {
			t.Errorf("number(%q) = %q, want %q", in, got, want)
		}
	}
}
