package main

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpuaas/gpu-dra-driver/pkg/health"
	"github.com/gpuaas/gpu-dra-driver/pkg/nvdev"
)

// healthReport is what the plugin's health monitor sees on these GPUs in
// a short run: whether it registered every GPU for XID events (a GPU that
// cannot deliver them gets an informational fault), and the faults it
// found, by XID event or by probing each GPU.
type healthReport struct {
	RanFor   string        `json:"ranFor"`
	Watching bool          `json:"watching"`
	Faults   []healthFault `json:"faults"`
}

type healthFault struct {
	GPU     string `json:"gpu"`
	Kind    string `json:"kind"`
	Value   string `json:"value"`
	Effect  string `json:"effect"`
	Message string `json:"message"`
}

// runHealth runs the plugin's health monitor, unchanged but for a 1 s
// probe interval and no state kept on disk, for d.
func runHealth(lib nvdev.Interface, d time.Duration) healthReport {
	m := health.New(lib, health.Config{ProbeInterval: time.Second}, health.NewMetrics(prometheus.NewRegistry()))
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	done := make(chan struct{})
	go func() { defer close(done); m.Run(ctx) }()
	r := healthReport{RanFor: d.String(), Faults: []healthFault{}}
	select {
	case <-m.Watching():
		r.Watching = true
	case <-ctx.Done():
	}
	<-done
	for _, f := range m.Faults() {
		r.Faults = append(r.Faults, healthFault{GPU: f.GPU, Kind: f.Kind, Value: f.Value, Effect: string(f.Effect), Message: f.Message})
	}
	return r
}
