package framework

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"sort"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Histogram is one series of a Prometheus histogram as a process exports
// it: cumulative bucket counts by upper bound, the sum and the count.
// Benchmarks read a component's own histogram (the controller's webhook
// latency) before and after a run to split a latency the client sees into
// the component's part and the rest.
type Histogram struct {
	Buckets []Bucket // by upper bound, ascending; counts cumulative
	Sum     float64
	Count   float64
}

// Bucket is a histogram bucket: how many observations were at most Le.
type Bucket struct {
	Le    float64
	Count float64
}

// ScrapeHistogram reads the histogram name from a Prometheus text
// endpoint, summed over the series whose labels include match (none
// matching is an empty histogram, not an error: a webhook not called yet
// has no series).
func ScrapeHistogram(ctx context.Context, url, name string, match map[string]string) (Histogram, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return Histogram{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return Histogram{}, fmt.Errorf("scraping %s: %w", url, err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return Histogram{}, fmt.Errorf("scraping %s: %s", url, resp.Status)
	}
	return ParseHistogram(resp.Body, name, match)
}

// ParseHistogram reads the histogram name from metrics in Prometheus's
// text format (as ScrapeHistogram; the API server's /metrics come through
// its client).
func ParseHistogram(r io.Reader, name string, match map[string]string) (Histogram, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(r)
	if err != nil {
		return Histogram{}, fmt.Errorf("parsing metrics: %w", err)
	}
	var h Histogram
	if f, ok := families[name]; ok {
		for _, m := range f.GetMetric() {
			if m.GetHistogram() != nil && hasLabels(m, match) {
				h = h.add(m.GetHistogram())
			}
		}
	}
	return h, nil
}

func hasLabels(m *dto.Metric, match map[string]string) bool {
	have := map[string]string{}
	for _, l := range m.GetLabel() {
		have[l.GetName()] = l.GetValue()
	}
	for k, v := range match {
		if have[k] != v {
			return false
		}
	}
	return true
}

// add sums a scraped series into h (series of one histogram share their
// buckets).
func (h Histogram) add(s *dto.Histogram) Histogram {
	byLe := map[float64]float64{}
	for _, b := range h.Buckets {
		byLe[b.Le] = b.Count
	}
	for _, b := range s.GetBucket() {
		byLe[b.GetUpperBound()] += float64(b.GetCumulativeCount())
	}
	out := Histogram{Sum: h.Sum + s.GetSampleSum(), Count: h.Count + float64(s.GetSampleCount())}
	for le, n := range byLe {
		out.Buckets = append(out.Buckets, Bucket{Le: le, Count: n})
	}
	sort.Slice(out.Buckets, func(i, j int) bool { return out.Buckets[i].Le < out.Buckets[j].Le })
	return out
}

// Since is what was observed between before and h (two scrapes of one
// counter-like histogram).
func (h Histogram) Since(before Histogram) Histogram {
	prior := map[float64]float64{}
	for _, b := range before.Buckets {
		prior[b.Le] = b.Count
	}
	out := Histogram{Sum: h.Sum - before.Sum, Count: h.Count - before.Count}
	for _, b := range h.Buckets {
		out.Buckets = append(out.Buckets, Bucket{Le: b.Le, Count: b.Count - prior[b.Le]})
	}
	return out
}

// QuantileBound is the upper bound of the bucket that holds the q-th
// quantile: the most any observation up to that rank can have taken
// (+Inf past the last finite bucket, NaN without observations). Unlike
// PromQL's histogram_quantile it does not interpolate, so it never claims
// less than a bucket shows.
func (h Histogram) QuantileBound(q float64) float64 {
	if h.Count <= 0 {
		return math.NaN()
	}
	rank := q * h.Count
	for _, b := range h.Buckets {
		if b.Count >= rank {
			return b.Le
		}
	}
	return math.Inf(1)
}

// Mean is the mean observation (NaN without observations).
func (h Histogram) Mean() float64 {
	if h.Count <= 0 {
		return math.NaN()
	}
	return h.Sum / h.Count
}
